"""scripts/learning_bench.py's reading and statistics, on hand-made run folders (the benchmark
itself trains for about an hour, so it is a script, not a test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import learning_bench as lb  # noqa: E402


def _fake_run(tmp: Path, rewards: list[float], val: tuple[float, float], scores: dict[str, float],
              skipped_step: int | None = None) -> Path:
    exp = tmp / "run"
    (exp / "validation_log").mkdir(parents=True)
    lines = [{"step": 0, "val/pass_rate": val[0]}]
    for i, r in enumerate(rewards, start=1):
        m = {"step": i, "seal/reward_mean": r, "actor/num_updates": 1.0, "seal/trained_episodes": 4.0,
             "actor/skipped_updates": 1.0 if i == skipped_step else 0.0,
             "actor/skipped_rows": 4.0 if i == skipped_step else 1.0, "actor/kl_loss": 0.01 * i}
        if i == len(rewards):
            m["val/pass_rate"] = val[1]
        lines.append(m)
    (exp / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (exp / "validation_log" / "0.jsonl").write_text("")
    (exp / "validation_log" / f"{len(rewards)}.jsonl").write_text(
        "".join(json.dumps({"task_id": t, "score": s}) + "\n" for t, s in scores.items()))
    return exp


def test_a_run_is_read_as_the_trainer_wrote_it(tmp_path: Path) -> None:
    exp = _fake_run(tmp_path, [0.2, 0.3, 0.5], (0.4, 0.5), {"a": 1.0, "b": 0.0}, skipped_step=1)
    r = lb.read_run(exp, "seal", 3)
    assert r.rewards == [0.2, 0.3, 0.5] and (r.updates, r.skipped_updates) == (2, 1)
    assert r.signal == [0.0, 0.75, 0.75] and r.kl_last == pytest.approx(0.03)
    assert (r.val_before, r.val_after) == (0.4, 0.5) and r.val_scores_after == {"a": 1.0, "b": 0.0}
    assert lb.finished(exp)


def test_the_advantage_share_is_read_from_its_own_metric(tmp_path: Path) -> None:
    """From step 2 on every row is in the update (its KL term has a gradient), so the rows left
    out no longer say how many episodes had an advantage: the trainer's count does."""
    exp = _fake_run(tmp_path, [0.2, 0.3, 0.5], (0.4, 0.5), {"a": 1.0})
    lines = [json.loads(x) for x in (exp / "metrics.jsonl").read_text().splitlines()]
    for m, rows in zip(lines[1:], (2.0, 0.0, 4.0)):
        m["actor/advantage_rows"] = rows
    (exp / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    assert lb.read_run(exp, "seal", 3).signal == [0.5, 0.0, 1.0]


def test_the_difference_and_its_intervals() -> None:
    m, lo, hi = lb.t_interval([0.1, 0.2, 0.3])
    assert m == pytest.approx(0.2) and lo < 0.2 < hi and hi - lo == pytest.approx(2 * 4.303 * 0.1 / 3 ** 0.5)
    a = [lb.RunResult("seal", s, val_scores_after={"x": 0.0, "y": 1.0}) for s in (0, 1)]
    b = [lb.RunResult("vanilla", s, val_scores_after={"x": 1.0, "y": 1.0}) for s in (0, 1)]
    lo, hi = lb.paired_bootstrap(a, b, resamples=2000)
    assert 0.0 <= lo <= 0.5 <= hi <= 1.0


def test_one_seed_has_no_t_interval_and_says_so() -> None:
    m, lo, hi = lb.t_interval([0.25])
    assert m == 0.25 and lb.span(lo, hi, 1) == "n/a (1 seed)"
    assert lb.span(-0.05, 0.125, 3) == "[-0.050, +0.125]"


def test_variants_name_the_ablation_switches_for_the_configs_environment() -> None:
    assert lb.variant_overrides("vanilla", "notes") == ("vanilla", ["seal.enable=false",
                                                                    "env_service.notes.observation_lite.enable=false"])
    assert lb.variant_overrides("lr=actor_rollout_ref.actor.optim.lr=1e-5", "bfcl") == (
        "lr", ["actor_rollout_ref.actor.optim.lr=1e-5"])
    with pytest.raises(SystemExit, match="--variants"):
        lb.variant_overrides("no spec", "bfcl")


def test_a_missing_config_is_one_line() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "learning_bench.py"), "--conf", "exp/nope.yaml"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "learning_bench: --conf exp/nope.yaml: no such file"


def test_rls_own_gain_is_after_minus_before_per_seed_and_task(tmp_path: Path) -> None:
    """The warm-started policy's validation (the first log) against the last, greedy and sampled
    (each task's pass fraction over its sampled episodes)."""
    exp = _fake_run(tmp_path, [0.2, 0.3], (0.5, 0.5), {"a": 1.0, "b": 0.0})
    (exp / "validation_log" / "0.jsonl").write_text(
        "".join(json.dumps({"task_id": t, "score": s}) + "\n" for t, s in {"a": 0.0, "b": 1.0}.items()))
    sampled = exp / "validation_log_sampled"
    sampled.mkdir()
    rows = {0: [("a", 0.0), ("a", 0.0), ("b", 1.0), ("b", 0.0)], 2: [("a", 1.0), ("a", 1.0), ("b", 1.0), ("b", 0.0)]}
    for step, pairs in rows.items():
        (sampled / f"{step}.jsonl").write_text("".join(json.dumps({"task_id": t, "score": s}) + "\n" for t, s in pairs))
    r = lb.read_run(exp, "seal", 0)
    assert r.val_scores_before == {"a": 0.0, "b": 1.0} and r.sampled_before == {"a": 0.0, "b": 0.5}
    assert r.sampled_after == {"a": 1.0, "b": 0.5}
    greedy = lb.rl_gain([r], sampled=False)
    assert greedy["mean"] == 0.0 and greedy["pairs"] == 2
    assert lb.flips(r) == (1, 1)  # a newly passed, b newly failed
    gain = lb.rl_gain([r, lb.RunResult("seal", 1, sampled_before={"a": 0.25, "b": 0.5},
                                       sampled_after={"a": 0.75, "b": 0.5})], sampled=True)
    assert gain["per_seed"] == [0.5, 0.25] and gain["mean"] == pytest.approx(0.375) and gain["pairs"] == 4
    assert 0.0 <= gain["bootstrap95"][0] <= 0.375 <= gain["bootstrap95"][1] <= 1.0
    assert lb.rl_gain([lb.RunResult("seal", 2)], sampled=True) is None


def test_the_sampled_difference_pairs_each_tasks_fraction(capsys) -> None:
    a = [lb.RunResult("seal", s, val_after=0.5, sampled_after={"x": 0.0, "y": 0.5}) for s in (0, 1)]
    b = [lb.RunResult("vanilla", s, val_after=0.5, sampled_after={"x": 0.5, "y": 1.0}) for s in (0, 1)]
    summary: dict = {}
    lb.difference(["seal", "vanilla"], a, b, summary)
    assert summary["difference"]["mean"] == 0.0
    assert summary["difference_sampled"]["per_seed"] == [0.5, 0.5]
    assert summary["difference_sampled"]["bootstrap95"] == [0.5, 0.5]
    assert "sampled held-out pass fraction after training: +0.500" in capsys.readouterr().out


def test_a_run_without_its_own_before_validation_takes_the_first_runs(tmp_path: Path) -> None:
    """--share-before: a later run skips the validation before training (no step-0 log or metric);
    its after-figures are its own, its before-figures the first run's."""
    exp = _fake_run(tmp_path, [0.2, 0.3], (0.5, 0.75), {"a": 1.0, "b": 0.0})
    (exp / "validation_log" / "0.jsonl").unlink()
    lines = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    (exp / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines if m["step"] != 0))
    run = lb.read_run(exp, "vanilla", 1)
    assert run.val_before is None and run.val_scores_before == {} and run.val_scores_after == {"a": 1.0, "b": 0.0}
    baseline = lb.RunResult("seal", 0, val_before=0.5, val_scores_before={"a": 0.0, "b": 1.0},
                            sampled_before={"a": 0.5, "b": 0.5})
    run = lb.with_baseline(run, baseline)
    assert (run.val_before, run.val_after) == (0.5, 0.75)
    assert lb.rl_gain([run], sampled=False)["mean"] == 0.0
    assert run.sampled_before == {"a": 0.5, "b": 0.5}
    own = lb.RunResult("seal", 2, val_before=0.25, val_scores_before={"a": 1.0, "b": 1.0})
    assert lb.with_baseline(own, baseline).val_scores_before == {"a": 1.0, "b": 1.0}  # a reused run keeps its own


def test_every_variant_starts_from_the_configs_own_warm_start(monkeypatch, tmp_path: Path) -> None:
    """Whatever the variants and their order: vanilla alone or first must not fine-tune a warm start
    of its own on transcripts without the schema hints (a different starting policy)."""
    from omegaconf import OmegaConf

    from seal import warm_start
    from seal.config import compose_config
    from seal.trainer.tasks import warm_start_task_ids

    interfaces = []

    def prepare(cfg, **_):
        interfaces.append(OmegaConf.select(cfg, "env_service.notes.observation_lite.enable"))
        cfg.actor_rollout_ref.model.path = "/checkpoint/of/the/recipe"
        return cfg

    monkeypatch.setattr(warm_start, "prepare", prepare)
    runs = []

    def run_one(conf, variant, extra, seed, out, overrides, *, reuse=False):
        runs.append((variant, seed, extra))
        return lb.RunResult(variant, seed)

    monkeypatch.setattr(lb, "run_one", run_one)
    monkeypatch.setattr(lb, "plot", lambda results, path: None)
    conf = "exp/learning/notes_binary_wide.yaml"
    assert lb.main(["--conf", conf, "--seeds", "1", "--variants", "vanilla", "seal", "--out", str(tmp_path)]) == 0
    assert interfaces == [True]  # the recipe's own warm start: schema hints on, as SEAL trains
    assert [(v, s) for v, s, _ in runs] == [("vanilla", 1), ("seal", 1)]
    for _, _, extra in runs:
        assert extra[:2] == ["seal.warm_start.enable=false", "actor_rollout_ref.model.path=/checkpoint/of/the/recipe"]
        rl_ids = extra[2].removeprefix("seal.tasks.train_ids=[").removesuffix("]").split(",")
        assert len(rl_ids) == 24
        assert not set(rl_ids) & set(warm_start_task_ids(compose_config(conf, [])))
    assert "seal.enable=false" in runs[0][2] and "seal.enable=false" not in runs[1][2]
