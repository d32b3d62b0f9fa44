"""A-Patch (docs/paper_map.md §2): scales, dynamic weights, apply modes, budget, metrics, registry."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seal.advantage import (
    APatchConfig,
    apatch_reweight,
    apply_scales,
    budget_scales,
    get_reweighter,
    prepare_tag_weights,
    register_reweighter,
    trajectory_scale,
    update_dynamic_weights,
)
from apatch_reference import apatch_reweight_reference
from seal.diagnosis import CapabilityState
from seal_shared.tags import default_tag_weights, excluded_tags
from seal_shared.types import UNKNOWN_TAG, FailureTag

T = FailureTag
DEFAULT_TAG_WEIGHTS, EXCLUDED_TAGS = default_tag_weights(), excluded_tags()  # the release's (no plug-in yet)
ALL_TAGS = [str(t) for t in FailureTag] + [UNKNOWN_TAG]
tag_lists = st.lists(st.sampled_from(ALL_TAGS), min_size=0, max_size=6)
weights_st = st.dictionaries(st.sampled_from(ALL_TAGS), st.floats(0.0, 5.0), min_size=0, max_size=len(ALL_TAGS))
SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def batches(draw):
    B = draw(st.integers(1, 6))
    T_ = draw(st.integers(1, 5))
    vals = draw(st.lists(st.floats(-3, 3, allow_nan=False, allow_subnormal=False, width=32), min_size=B * T_, max_size=B * T_))
    adv = torch.tensor(vals, dtype=torch.float32).reshape(B, T_)
    tags = draw(st.lists(st.one_of(st.none(), tag_lists), min_size=B, max_size=B))
    return adv, tags


# ---- trajectory_scale ----------------------------------------------------------------------


@SETTINGS
@given(tag_lists, weights_st, st.floats(0.0, 1.0), st.floats(1.0, 4.0))
def test_scale_stays_in_range(tags, weights, lo, hi) -> None:
    s = trajectory_scale(tags, weights, min_scale=lo, max_scale=hi)
    kept = [t for t in tags if t not in EXCLUDED_TAGS]
    if kept:
        assert lo <= s <= hi
    else:
        assert s == 1.0


def test_scale_mean_ignores_excluded_and_defaults_to_one() -> None:
    w = {"pass": 1.0, "state_mismatch": 1.6}
    tags = [T.PASS, T.STATE_MISMATCH, T.CHECKER_ERROR, T.GT_ERROR, UNKNOWN_TAG]
    assert trajectory_scale(tags, w, min_scale=0.5, max_scale=2.0) == pytest.approx((1.0 + 1.6 + 1.0) / 3, abs=1e-12)
    assert trajectory_scale([T.GT_ERROR, T.CHECKER_ERROR], {"gt_error": 9.0}, min_scale=0.5, max_scale=2.0) == 1.0
    assert trajectory_scale([T.SPURIOUS_TOOL_CALL] * 2, {"spurious_tool_call": 3.0}, min_scale=0.5, max_scale=2.0) == 2.0


# ---- update_dynamic_weights ----------------------------------------------------------------

KW = dict(ema_beta=0.25, prevalence_alpha=1.0, confidence_samples=32, min_scale=0.5, max_scale=2.0)


def test_reference_worked_example() -> None:
    """§3.4: state_mismatch n=300 of N=1000, r̄=0.1 -> target 1.27, w 1.0675, s 1.045."""
    counts = {"state_mismatch": 300, "pass": 700}
    w = update_dynamic_weights({}, DEFAULT_TAG_WEIGHTS, counts, {"state_mismatch": 0.1, "pass": 1.0}, **KW)
    target = 1.0 * (1 + 0.3 * 0.9 * 1)
    assert abs(target - 1.27) < 1e-9
    assert abs(w["state_mismatch"] - (0.75 * 1.0 + 0.25 * 1.27)) < 1e-9
    assert abs(w["state_mismatch"] - 1.0675) < 1e-9
    s = trajectory_scale([T.PASS, T.STATE_MISMATCH, T.STATE_MISMATCH], w, min_scale=0.5, max_scale=2.0)
    assert abs(s - (1.0 + 2 * 1.0675) / 3) < 1e-9
    assert abs(s - 1.045) < 1e-9
    assert w["pass"] == 1.0  # pass moves toward its base only


def test_formula_terms_one_by_one() -> None:
    base = {"empty_turn_model_response": 1.5}
    counts = {"empty_turn_model_response": 8, "pass": 8, "gt_error": 100}  # gt_error is not in N
    w = update_dynamic_weights({"empty_turn_model_response": 1.2}, base, counts, {"empty_turn_model_response": 0.25}, **KW)
    n, N, C = 8, 16, 32
    target = min(2.0, 1.5 * (1 + 1.0 * (n / N) * (1 - 0.25) * min(1, n / C)))
    assert w["empty_turn_model_response"] == pytest.approx(0.75 * 1.2 + 0.25 * target, abs=1e-12)
    assert w["gt_error"] == pytest.approx(0.75 * 1.0 + 0.25 * 1.0, abs=1e-12)  # excluded: target 1


def test_no_counts_returns_base_and_explicit_zero_knobs() -> None:
    assert update_dynamic_weights({"pass": 3.0}, {"pass": 1.0}, {"gt_error": 5}, {}, **KW) == {"pass": 1.0}
    counts, means = {"state_mismatch": 10, "pass": 10}, {"state_mismatch": 0.0}
    prev = {"state_mismatch": 1.3}
    frozen = update_dynamic_weights(prev, {"state_mismatch": 1.0}, counts, means, **{**KW, "ema_beta": 0.0})
    assert frozen["state_mismatch"] == 1.3  # beta = 0: no movement at all
    flat = update_dynamic_weights(prev, {"state_mismatch": 1.0}, counts, means, **{**KW, "ema_beta": 1.0, "prevalence_alpha": 0.0})
    assert flat["state_mismatch"] == 1.0  # alpha = 0: target is the base
    clamped = update_dynamic_weights(prev, {"state_mismatch": 1.0}, counts, means, **{**KW, "ema_beta": 7.0})
    assert clamped["state_mismatch"] == pytest.approx(1.0 + 0.5 * 1.0 * 1 * (10 / 32), abs=1e-12)  # beta -> 1
    c0 = update_dynamic_weights({}, {}, counts, means, **{**KW, "ema_beta": 1.0, "confidence_samples": 0})
    assert c0["state_mismatch"] == pytest.approx(1.5, abs=1e-12)  # C -> max(1, 0): full confidence


@SETTINGS
@given(
    st.dictionaries(st.sampled_from(ALL_TAGS), st.integers(0, 500), min_size=1),
    st.dictionaries(st.sampled_from(ALL_TAGS), st.floats(0.0, 1.0)),
    st.floats(0.01, 1.0),
)
def test_dynamic_weights_converge_to_target(counts, means, beta) -> None:
    kw = {**KW, "ema_beta": beta}
    w: dict[str, float] = {}
    for _ in range(3000):
        nxt = update_dynamic_weights(w, DEFAULT_TAG_WEIGHTS, counts, means, **kw)
        if nxt == w:
            break
        w = nxt
    once = update_dynamic_weights(w, DEFAULT_TAG_WEIGHTS, counts, means, **{**kw, "ema_beta": 1.0})
    for tag, value in w.items():
        assert value == pytest.approx(once[tag], abs=1e-6)  # fixed point = the target
        assert 0.5 - 1e-9 <= value <= 2.0 + 1e-9
        if tag in EXCLUDED_TAGS and sum(n for t, n in counts.items() if t not in EXCLUDED_TAGS) > 0:
            assert value == pytest.approx(1.0, abs=1e-6)


# ---- apply_scales / budget -------------------------------------------------------------------


@SETTINGS
@given(batches(), st.sampled_from(["all", "positive_advantage", "negative_advantage"]))
def test_apply_modes_touch_only_intended_signs(batch, mode) -> None:
    adv, _ = batch
    scales = torch.linspace(0.5, 2.0, adv.shape[0])
    out = apply_scales(adv, scales, mode)
    expected_scaled = {"all": torch.ones_like(adv, dtype=torch.bool), "positive_advantage": adv > 0, "negative_advantage": adv < 0}[mode]
    scaled = adv * scales.unsqueeze(-1)
    assert torch.equal(out[expected_scaled], scaled[expected_scaled])
    assert torch.equal(out[~expected_scaled], adv[~expected_scaled])
    assert torch.equal(torch.sign(out), torch.sign(adv))  # positive scales never flip a sign


def test_apply_scales_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="apply_to"):
        apply_scales(torch.ones(1, 1), torch.ones(1), "both")


@SETTINGS
@given(st.lists(st.floats(0.9, 1.1), min_size=1, max_size=8), st.floats(0.9, 1.1))
def test_budget_mean_hits_target_when_unclipped(vals, target) -> None:
    scales = torch.tensor(vals + [1.7], dtype=torch.float64)
    active = torch.tensor([True] * len(vals) + [False])
    out = budget_scales(scales, active, strength=0.5, min_scale=0.1, max_scale=10.0, normalize_mean=True, target_mean=target)
    assert float(out[active].mean()) == pytest.approx(target, abs=1e-9)
    assert out[-1] == 1.7  # inactive row unchanged


def test_budget_strength_zero_means_all_ones() -> None:
    scales = torch.tensor([0.5, 2.0, 1.3], dtype=torch.float64)
    out = budget_scales(scales, torch.tensor([True, True, False]), strength=0.0, min_scale=0.5, max_scale=2.0,
                        normalize_mean=False, target_mean=1.0)
    assert out.tolist() == [1.0, 1.0, 1.3]


# ---- apatch_reweight -------------------------------------------------------------------------


@SETTINGS
@given(
    batches(),
    weights_st,
    st.sampled_from(["all", "positive_advantage", "negative_advantage"]),
    st.booleans(),
    st.booleans(),
)
def test_loop_and_vectorised_forms_agree(batch, weights, mode, budget, normalize) -> None:
    adv, tags = batch
    budget_cfg = {"enable": budget, "strength": 0.7, "normalize_mean": normalize, "target_mean": 1.1}
    cfg = APatchConfig(apply_to=mode, budget=budget_cfg)
    before = adv.clone()
    a, ma = apatch_reweight(adv, tags, cfg=cfg, weights=weights, step=3)
    b, mb = apatch_reweight_reference(adv, tags, cfg=cfg, weights=weights, step=3)
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert ma[k] == pytest.approx(mb[k], abs=1e-9), k
    assert torch.equal(adv, before)  # pure: input untouched


@SETTINGS
@given(batches())
def test_all_weights_one_is_identity(batch) -> None:
    adv, tags = batch
    cfg = APatchConfig()
    ones = {t: 1.0 for t in ALL_TAGS}
    out, metrics = apatch_reweight(adv, tags, cfg=cfg, weights=ones, step=0)
    assert torch.equal(out, adv)
    assert metrics["seal/apatch/mean_scale"] == 1.0


@SETTINGS
@given(batches(), weights_st)
def test_untagged_rows_untouched_and_counted(batch, weights) -> None:
    adv, tags = batch
    out, m = apatch_reweight(adv, tags, cfg=APatchConfig(), weights=weights, step=0)
    untagged = [i for i, t in enumerate(tags) if not t]
    for i in untagged:
        assert torch.equal(out[i], adv[i])
    assert m["seal/apatch/missing_tag_count"] == len(untagged)
    assert m["seal/apatch/scaled_count"] == len(tags) - len(untagged)


def test_pass_and_excluded_rows_behave_as_specified() -> None:
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [0.5, 0.5], [2.0, 0.0]])
    tags = [[T.PASS, T.PASS], [T.GT_ERROR, T.CHECKER_ERROR], [T.SPURIOUS_TOOL_CALL, T.PASS], [T.STATE_MISMATCH]]
    cfg = APatchConfig(tag_weights={"gt_error": 5.0, "checker_error": 5.0})
    out, m = apatch_reweight(adv, tags, cfg=cfg, weights=cfg.tag_weights, step=0)
    assert torch.equal(out[0], adv[0])  # pass weight 1 -> scale 1
    assert torch.equal(out[1], adv[1])  # only excluded tags -> scale 1 whatever their weight
    assert out[2, 0].item() == pytest.approx(0.5 * (2.0 + 1.0) / 2)  # pass dilutes spurious_tool_call
    assert torch.equal(out[3], adv[3])  # state_mismatch base weight 1.0
    assert m["seal/apatch/tag_frac/pass"] == pytest.approx(3 / 7)
    assert m["seal/apatch/tag_weight/gt_error"] == 5.0
    assert m["seal/apatch/mean_scale"] == pytest.approx((1 + 1 + 1.5 + 1) / 4)


def test_warmup_disabled_and_prefix() -> None:
    adv = torch.ones(2, 3)
    tags = [[T.SPURIOUS_TOOL_CALL], None]
    cfg = APatchConfig(warmup_steps=5, metric_prefix="x/ap")
    out, m = apatch_reweight(adv, tags, cfg=cfg, weights=cfg.tag_weights, step=4)
    assert torch.equal(out, adv) and out is not adv
    assert m == {"x/ap/enabled": 1.0, "x/ap/warmup_skipped": 1.0, "x/ap/scaled_count": 0.0}
    out, m = apatch_reweight(adv, tags, cfg=cfg, weights=cfg.tag_weights, step=5)
    assert out[0, 0] == 2.0 and m["x/ap/warmup_skipped"] == 0.0
    off = APatchConfig(enable=False)
    out, m = apatch_reweight(adv, tags, cfg=off, weights=off.tag_weights, step=9)
    assert torch.equal(out, adv) and m["seal/apatch/enabled"] == 0.0
    expected = {"enabled", "scaled_count", "missing_tag_count", "mean_scale", "budget_enabled", "budget_mean_before",
                "budget_mean_after", "dynamic_enabled", "warmup_skipped"}
    _, m = apatch_reweight(adv, tags, cfg=APatchConfig(), weights={}, step=0)
    assert expected <= {k.split("/", 2)[2] for k in m}


def test_budget_metrics_before_after() -> None:
    adv = torch.ones(3, 1)
    tags = [[T.SPURIOUS_TOOL_CALL], [T.INSTANCE_MISMATCH], [T.PASS]]
    cfg = APatchConfig(budget={"enable": True, "strength": 1.0, "normalize_mean": True, "target_mean": 1.0})
    out, m = apatch_reweight(adv, tags, cfg=cfg, weights=cfg.tag_weights, step=0)
    assert m["seal/apatch/budget_mean_before"] == pytest.approx((2.0 + 0.6 + 1.0) / 3)
    assert m["seal/apatch/budget_mean_after"] == pytest.approx(float(out.mean()), abs=1e-6)
    assert m["seal/apatch/mean_scale"] == m["seal/apatch/budget_mean_after"]


def test_prepare_uses_state_only_when_dynamic_and_past_warmup() -> None:
    state = CapabilityState()
    for _ in range(40):
        state.observe("multi_turn_base", "multi_turn_base_1", 0.0, False, [T.STATE_MISMATCH], epoch=0, step=0)
    cfg = APatchConfig(warmup_steps=2)
    assert prepare_tag_weights(cfg, 1, state, {}) == (cfg.tag_weights, {"tag_weights": {}})
    w, kept = prepare_tag_weights(cfg, 2, state, {})
    assert w["state_mismatch"] == pytest.approx(0.75 + 0.25 * 2.0)  # n/N = 1, r̄ = 0 -> target clipped at 2
    assert kept == {"tag_weights": w}
    w2, kept2 = prepare_tag_weights(cfg, 3, state, kept)  # the next EMA step starts from the kept weights
    assert w2["state_mismatch"] == pytest.approx(0.75 * w["state_mismatch"] + 0.25 * 2.0) and kept2 == {"tag_weights": w2}
    static = APatchConfig(dynamic={"enable": False})
    assert prepare_tag_weights(static, 10, state, kept) == (static.tag_weights, kept)


# ---- config and registry ---------------------------------------------------------------------


def test_config_defaults_and_validation() -> None:
    cfg = APatchConfig()
    assert (cfg.min_scale, cfg.max_scale, cfg.apply_to, cfg.warmup_steps) == (0.5, 2.0, "all", 0)
    assert cfg.tag_weights == {str(k): v for k, v in DEFAULT_TAG_WEIGHTS.items()}
    assert (cfg.dynamic.enable, cfg.dynamic.ema_beta, cfg.dynamic.prevalence_alpha, cfg.dynamic.confidence_samples) == (True, 0.25, 1.0, 32)
    assert cfg.budget.enable is False
    merged = APatchConfig(tag_weights={"pass": 0.0})
    assert merged.tag_weights["pass"] == 0.0 and merged.tag_weights["spurious_tool_call"] == 2.0
    for bad, key in [
        ({"apply_to": "both"}, "apply_to"),
        ({"min_scale": 3.0}, "min_scale"),
        ({"tag_weights": {"state_mismatc": 1.0}}, "state_mismatc"),
        ({"dynamic": {"ema_beta": 1.5}}, "ema_beta"),
        ({"dynamic": {"emabeta": 0.5}}, "emabeta"),
        ({"budget": {"strength": -1}}, "strength"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"bogus": 1}, "bogus"),
    ]:
        with pytest.raises((ValueError, TypeError), match=key):
            APatchConfig.from_dict(bad)


def test_registry() -> None:
    assert get_reweighter("apatch") is apatch_reweight
    adv = torch.randn(2, 3)
    out, m = get_reweighter("identity")(adv, [[T.SPURIOUS_TOOL_CALL], None], cfg=APatchConfig(), weights={}, step=0)
    assert torch.equal(out, adv) and m == {"seal/apatch/enabled": 0.0}
    with pytest.raises(KeyError, match=r"known: \['apatch', 'identity'"):
        get_reweighter("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_reweighter("apatch")(lambda *a, **k: None)


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="tag lists"):
        apatch_reweight(torch.ones(2, 2), [None], cfg=APatchConfig(), weights={}, step=0)
    assert math.isclose(trajectory_scale([], {}, min_scale=0.5, max_scale=2.0), 1.0)
