"""The start-of-run validation cache (seal.local.validation_cache) on the real episode runner, the
in-process ``notes`` environment and a tiny random Llama: the first run computes and stores its
step-0 greedy validation; a run with the same key reads it (no episode played, the same log and
metrics); a change in any deciding part (weights, a deciding config key, the tasks) computes again;
a change the key leaves out (names, seeds, the optimizer) still reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from seal.config import REPO_ROOT, compose_config
from seal.trainer.local.validation_cache import ValidationCache, deciding_config

VAL_IDS = ["notes_060", "notes_061"]


def cache_cfg(name: str, extra: list[str] = ()):
    return compose_config(REPO_ROOT / "exp" / "quickstart.yaml", [
        f"trainer.experiment_name={name}", "seal.warm_start.enable=false", "env_service.url=null",
        f"seal.tasks.val_ids=[{','.join(VAL_IDS)}]", "seal.local.tensorboard=false",
        "seal.local.progress_bars=false", "seal.rollout.max_tokens_per_call=12", "seal.rollout.max_llm_calls=2",
        *extra])


class CountingRunner:
    """The project's runner, counting the episodes it plays."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.played = inner, 0

    async def run(self, *args: Any, **kwargs: Any) -> Any:
        self.played += 1
        return await self.inner.run(*args, **kwargs)


@pytest.fixture
def validate(tmp_path, tokenizer, make_model, monkeypatch):
    """``validate(name, extra=(), model_seed=0) -> (metrics, log lines, episodes played)``."""
    from seal.trainer.local.loop import LocalTrainer, default_runner_factory

    monkeypatch.setenv("SEAL_VALIDATION_CACHE", str(tmp_path / "cache"))

    def run(name: str, extra: list[str] = (), model_seed: int = 0, step: int = 0, global_step: int = 0):
        counting: list[CountingRunner] = []

        def factory(*args: Any) -> Any:
            counting.append(CountingRunner(default_runner_factory(*args)))
            return counting[0]

        trainer = LocalTrainer(cache_cfg(name, list(extra)), tmp_path / name, runner_factory=factory,
                               model=make_model(model_seed), tokenizer=tokenizer)
        try:
            trainer.global_step = global_step
            metrics = trainer.validate(step)
        finally:
            trainer.close()
        log = (tmp_path / name / "validation_log" / f"{step}.jsonl").read_text().splitlines()
        return metrics, [json.loads(line) for line in log], counting[0].played

    return run


def verdicts(lines: list[dict]) -> list[tuple]:
    return [(r["task_id"], r.get("valid"), json.dumps(r.get("messages"))) for r in lines]


def test_a_run_with_the_same_key_reads_the_stored_validation(validate, tmp_path):
    first, first_log, played = validate("first")
    assert played == len(VAL_IDS) and first["val/from_cache"] == 0.0
    assert len(list((tmp_path / "cache").iterdir())) == 1
    # A different name, seed, learning rate and step count decide nothing of this validation.
    again, again_log, played = validate("again", ["data.seed=7", "actor_rollout_ref.actor.optim.lr=1e-3",
                                                  "trainer.total_epochs=9"])
    assert played == 0 and again["val/from_cache"] == 1.0
    assert again_log == first_log
    assert {k: v for k, v in again.items() if not k.startswith(("timing/", "val/from_cache"))} == \
        {k: v for k, v in first.items() if not k.startswith(("timing/", "val/from_cache"))}


def test_the_stored_validation_is_what_the_policy_computes(validate):
    validate("stored")
    cached, cached_log, played = validate("read")
    assert played == 0
    fresh, fresh_log, played = validate("fresh", ["seal.local.validation_cache=false"])
    assert played == len(VAL_IDS) and fresh["val/pass_rate"] == cached["val/pass_rate"]
    assert verdicts(fresh_log) == verdicts(cached_log)


@pytest.mark.parametrize("change", [
    {"model_seed": 1},                                               # other weights
    {"extra": ["seal.rollout.max_tokens_per_call=10"]},              # a deciding config key
    {"extra": ["seal.tasks.val_ids=[notes_060,notes_062]"]},         # other tasks (and prompts)
    {"extra": ["env_service.notes.observation_lite.apply_to_validation=true"]},  # the validation interface
])
def test_a_changed_key_validates_again(validate, tmp_path, change):
    validate("base")
    metrics, _, played = validate("changed", **change)
    assert played == len(VAL_IDS) and metrics["val/from_cache"] == 0.0
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_only_a_fresh_runs_step_zero_reads_the_cache(validate):
    validate("base")
    assert validate("later", step=3, global_step=3)[2] == len(VAL_IDS)
    assert validate("resumed", global_step=2)[2] == len(VAL_IDS)


def test_the_key_leaves_out_only_what_cannot_decide_validation():
    cfg = compose_config(REPO_ROOT / "exp" / "quickstart.yaml", [])
    kept = deciding_config(cfg)
    assert "trainer" not in kept and "actor" not in kept["actor_rollout_ref"]
    assert kept["actor_rollout_ref"]["rollout"]["val_kwargs"] == dict(cfg.actor_rollout_ref.rollout.val_kwargs)
    assert kept["seal"]["rollout"]["max_tokens_per_call"] == cfg.seal.rollout.max_tokens_per_call
    assert "sampled_validation_n" not in kept["seal"]["local"] and "validation_cache" in kept["seal"]["local"]


def test_an_entry_is_written_whole(tmp_path):
    from seal.trainer.local.validation_cache import ValidationKey

    cache = ValidationCache(tmp_path)
    log = tmp_path / "log.jsonl"
    log.write_text('{"task_id": "x"}\n')
    key = ValidationKey({"weights": "a"})
    assert cache.load(key) is None
    cache.store(key, log, {"val/pass_rate": 0.5})
    assert cache.load(key).metrics == {"val/pass_rate": 0.5}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".partial")] == []
