"""policy_update leaves out rows that cannot change the weights, exactly.

A row whose advantage is 0 everywhere has a PPO-clip term of 0; with no KL term, or a KL term
whose gradient vanishes because the policy still equals the reference, it is skipped, and a
batch of such rows does no forward, no backward and no optimizer step.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from seal.episode import EpisodeResult
from seal.trainer.local.episodes import Episode
from seal.trainer.local.policy import LossSettings, frozen_copy, response_logprobs, sequence_loss
from seal.trainer.local import update
from seal.trainer.local.update import build_batch, kl_gradient_is_zero, policy_update, rows_with_signal

CPU = torch.device("cpu")


def tiny_policy(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    return LlamaForCausalLM(cfg)


def episodes(rewards: list[float], seed: int = 1) -> list[Episode]:
    """Pairs of episodes (one GRPO group per pair) with random tokens; rows 2k and 2k+1 share a uid."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, reward in enumerate(rewards):
        prompt = torch.randint(3, 128, (12 + i,), generator=g).tolist()
        response = torch.randint(3, 128, (8 + 2 * i,), generator=g).tolist()
        mask = [1] * 5 + [0] * 2 + [1] * (len(response) - 7)
        result = EpisodeResult(task_id=f"t{i // 2}", category="multi_turn_base", reward=reward)
        out.append(Episode(result, uid=f"u{i // 2}", sample=i % 2, prompt_ids=prompt, response_ids=response,
                           response_mask=mask))
    return out


def settings(*, kl: bool, kl_type: str = "low_var_kl") -> LossSettings:
    return LossSettings(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=10.0,
                        loss_agg_mode="token-mean", use_kl_loss=kl, kl_loss_coef=0.001, kl_loss_type=kl_type)


def advantages_for(batch, values: list[float]) -> torch.Tensor:
    """One advantage per row, spread over its response tokens (zero off the mask): ``(B, T)``."""
    return torch.tensor(values).unsqueeze(1) * batch.mask


class ForwardCounter:
    """Counts forward calls of a module (a real hook on the real module)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.handle = module.register_forward_pre_hook(self._count)

    def _count(self, *_: object) -> None:
        self.calls += 1


def run_update(model, ref, optimizer, batch, adv, loss: LossSettings, **kw) -> dict[str, float]:
    opts = {"mini_batch_rows": len(batch.episodes), "ppo_epochs": 1, "grad_clip": 1.0} | kw
    return policy_update(model, ref, optimizer, batch, adv, loss, device=CPU, autocast="none", **opts)


def state_snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())


def assert_unchanged(before: tuple[dict, dict], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    weights, opt = before
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    now = optimizer.state_dict()
    assert now["state"].keys() == opt["state"].keys()
    for idx, st in opt["state"].items():
        for k, v in st.items():
            assert torch.equal(torch.as_tensor(now["state"][idx][k]), torch.as_tensor(v)), (idx, k)


@pytest.mark.parametrize("kl", [True, False])
def test_all_zero_advantages_do_no_forward_backward_or_step(kl: bool) -> None:
    """The quickstart's case: every group's rewards are equal, every advantage is 0."""
    model = tiny_policy()
    ref = frozen_copy(model) if kl else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    batch = build_batch(episodes([1.0, 1.0, 0.0, 0.0]))
    before = state_snapshot(model, optimizer)
    policy_calls, ref_calls = ForwardCounter(model), ForwardCounter(ref) if kl else None
    backward_calls = []
    model.model.embed_tokens.weight.register_hook(lambda g: backward_calls.append(1))
    metrics = run_update(model, ref, optimizer, batch, torch.zeros_like(batch.mask), settings(kl=kl))
    assert policy_calls.calls == 0 and backward_calls == []
    assert ref_calls is None or ref_calls.calls == 0
    assert_unchanged(before, model, optimizer)
    assert metrics["actor/skipped_updates"] == 1.0 and metrics["actor/skipped_rows"] == 4.0


def test_skip_keeps_existing_optimizer_state() -> None:
    """After a real step (AdamW moments and step count exist), an all-zero batch without a KL term
    leaves weights and optimizer state as they were."""
    model = tiny_policy()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    batch = build_batch(episodes([1.0, 0.0]))
    run_update(model, None, optimizer, batch, advantages_for(batch, [0.7, -0.7]), settings(kl=False))
    assert optimizer.state_dict()["state"]  # a step happened
    before = state_snapshot(model, optimizer)
    metrics = run_update(model, None, optimizer, batch, torch.zeros_like(batch.mask), settings(kl=False))
    assert_unchanged(before, model, optimizer)
    assert metrics["actor/skipped_updates"] == 1.0


def test_zero_rows_train_once_the_policy_left_the_reference() -> None:
    """With a KL term and weights that differ from the reference, the KL gradient is not 0: the
    zero-advantage rows must train (and the weights move)."""
    model = tiny_policy()
    ref = frozen_copy(model)
    with torch.no_grad():
        model.lm_head.weight.add_(0.05)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = build_batch(episodes([1.0, 1.0]))
    counter = ForwardCounter(model)
    before = copy.deepcopy(model.state_dict())
    metrics = run_update(model, ref, optimizer, batch, torch.zeros_like(batch.mask), settings(kl=True))
    assert counter.calls == 2 and metrics["actor/skipped_updates"] == 0.0
    assert not torch.equal(model.lm_head.weight, before["lm_head.weight"])


def test_the_reference_pass_waits_until_the_policy_left_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the weights equal the reference's, its log-probs are the policy's own: the first
    mini-batch runs no reference forward, the second (after an optimizer step) does. The result
    is the update that runs the reference pass throughout (forced here) to fp32 rounding."""

    def update_from_scratch(force_reference_pass: bool) -> tuple[dict, list[dict], int]:
        model = tiny_policy()
        ref = frozen_copy(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = build_batch(episodes([1.0, 0.0, 0.0, 1.0]))
        adv = advantages_for(batch, [0.7, -0.7, -0.7, 0.7])
        ref_calls = ForwardCounter(ref)
        seen: list[dict] = []
        real = update._train_minibatch
        monkeypatch.setattr(update, "_train_minibatch",
                            lambda *a, **k: (out := real(*a, **k), seen.append(out[1]))[0])
        if force_reference_pass:
            monkeypatch.setattr(update, "same_weights", lambda *_: False)
        run_update(model, ref, optimizer, batch, adv, settings(kl=True), mini_batch_rows=2)
        monkeypatch.undo()
        return copy.deepcopy(model.state_dict()), seen, ref_calls.calls

    weights, seen, ref_calls = update_from_scratch(False)
    forced_weights, forced_seen, forced_ref_calls = update_from_scratch(True)
    assert ref_calls == 2 and forced_ref_calls == 4  # one forward per row (no shared prefix here)
    assert seen[0]["actor/kl_loss"] == 0.0 and seen[1]["actor/kl_loss"] > 0.0
    assert forced_seen[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert seen[1]["actor/kl_loss"] == pytest.approx(forced_seen[1]["actor/kl_loss"], rel=1e-4)
    for name, value in weights.items():
        assert torch.allclose(value, forced_weights[name], rtol=1e-5, atol=1e-7), name


def test_k1_kl_has_a_gradient_at_the_reference() -> None:
    model = tiny_policy()
    loss = settings(kl=True, kl_type="kl")
    assert kl_gradient_is_zero(model, frozen_copy(model), loss)[0] is False
    for name in ["low_var_kl", "k3", "mse", "k2", "abs", "k1+", "low_var_kl+"]:
        assert kl_gradient_is_zero(model, frozen_copy(model), settings(kl=True, kl_type=name))[0], name


def test_an_entropy_term_keeps_every_row() -> None:
    batch = build_batch(episodes([1.0, 1.0]))
    zero = torch.zeros_like(batch.mask)
    assert rows_with_signal(zero, batch.mask, settings(kl=False)) == [False, False]
    with_entropy = settings(kl=False)
    with_entropy.entropy_coeff = 0.01
    assert rows_with_signal(zero, batch.mask, with_entropy) == [True, True]


class GradRecorder(torch.optim.SGD):
    """Plain SGD that also keeps a copy of the gradients it stepped with."""

    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        self.grads = {id(p): p.grad.clone() for g in self.param_groups for p in g["params"] if p.grad is not None}
        return super().step(closure)


def full_batch_gradients(model, ref, batch, adv, loss: LossSettings) -> dict[int, torch.Tensor]:
    """The gradient of the mini-batch token-mean loss over every row (the update without the shortcut)."""
    model.zero_grad(set_to_none=True)
    ntok = int(batch.mask.sum())
    for i, e in enumerate(batch.episodes):
        r = len(e.response_ids)
        logp = response_logprobs(model, e.prompt_ids, e.response_ids, CPU)
        ref_logp = None
        if ref is not None:
            with torch.no_grad():
                ref_logp = response_logprobs(ref, e.prompt_ids, e.response_ids, CPU).unsqueeze(0)
        out, _ = sequence_loss(logp.unsqueeze(0), logp.detach().unsqueeze(0), ref_logp, adv[i : i + 1, :r],
                               batch.mask[i : i + 1, :r], loss, batch_num_tokens=ntok,
                               global_batch_size=len(batch.episodes))
        out.backward()
    grads = {id(p): p.grad.clone() for p in model.parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("kl", [True, False])
def test_mixed_batch_trains_only_signal_rows_with_the_full_batch_gradient(kl: bool) -> None:
    model = tiny_policy()
    ref = frozen_copy(model) if kl else None
    batch = build_batch(episodes([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]))
    adv = advantages_for(batch, [0.7, -0.7, 0.0, 0.0, -0.7, 0.7])
    expected = full_batch_gradients(model, ref, batch, adv, settings(kl=kl))
    optimizer = GradRecorder(model.parameters(), lr=0.0)
    counter = ForwardCounter(model)
    metrics = run_update(model, ref, optimizer, batch, adv, settings(kl=kl), grad_clip=1e9)
    assert counter.calls == 4 and metrics["actor/skipped_rows"] == 2.0 and metrics["actor/skipped_updates"] == 0.0
    assert metrics["actor/advantage_rows"] == 4.0
    assert expected.keys() == optimizer.grads.keys()
    for key, grad in expected.items():
        assert torch.allclose(optimizer.grads[key], grad, rtol=1e-5, atol=1e-9)
    assert any(g.abs().sum() > 0 for g in expected.values())


def test_loss_metrics_are_per_mini_batch_as_verl_reports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each mini-batch reports its loss (its sequences' shares summed: the loss it stepped on) and
    its gradient norm; the update reports their means over mini-batches, as verl's ``fit()``
    reduces its worker's per-mini-batch metrics. A seq-mean divides by the configured mini-batch
    size (verl's ``ppo_mini_batch_size x n``), however many of its rows are trained."""
    model = tiny_policy()
    ref = frozen_copy(tiny_policy(seed=1))  # a KL term with a value
    batch = build_batch(episodes([1.0, 0.0, 0.0, 1.0, 1.0]))
    adv = advantages_for(batch, [0.7, -0.7, -0.7, 0.7, 0.0])
    calls, norms = [], []
    loss_fn, clip = update.sequence_loss, torch.nn.utils.clip_grad_norm_

    def recording_loss(*args, **kwargs):
        loss, metrics = loss_fn(*args, **kwargs)
        calls.append((kwargs["global_batch_size"], metrics))
        return loss, metrics

    monkeypatch.setattr(update, "sequence_loss", recording_loss)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: norms.append(clip(*a, **k)) or norms[-1])
    metrics = run_update(model, ref, torch.optim.AdamW(model.parameters(), lr=1e-3), batch, adv, settings(kl=True),
                         mini_batch_rows=3)  # mini-batches of rows 0-2 and 3-4

    assert [size for size, _ in calls] == [3] * 5
    shares = [m for _, m in calls]
    for key in ("actor/pg_loss", "actor/kl_loss"):
        per_mini_batch = [sum(m[key] for m in shares[:3]), sum(m[key] for m in shares[3:])]
        assert metrics[key] == pytest.approx(sum(per_mini_batch) / 2, rel=1e-12)
    clipfrac = [sum(m["actor/pg_clipfrac"] for m in shares[:3]) / 3, sum(m["actor/pg_clipfrac"] for m in shares[3:]) / 2]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(sum(clipfrac) / 2, rel=1e-12)
    assert metrics["actor/grad_norm"] == pytest.approx(sum(float(n) for n in norms) / 2, rel=1e-12)
    assert metrics["actor/kl_loss"] > 0 and len(norms) == 2
