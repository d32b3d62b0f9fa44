"""Environment faults: faulted episodes are logged, never trained on or observed, and the run
continues or stops with a clear message depending on ``seal.local.max_fault_fraction``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from seal.config import REPO_ROOT
from seal.trainer.local.loop import EnvFaultError

TASK = "multi_turn_miss_func_3"


def test_faulted_episodes_are_left_out(tmp_path, make_trainer, scripted_runner):
    # One of the two tasks of step 1 always faults: 2 of 4 episodes (= the limit 0.5, so it goes on).
    runner = scripted_runner()
    trainer, _ = make_trainer(tmp_path / "run", runner=runner, extra=["trainer.val_before_train=false"])
    try:
        first = trainer.sampler.permutation(0)[0]
        runner.faults = {first: -1}
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["seal/env_faults"] == 2.0 and metrics["seal/trained_episodes"] == 2.0
    assert trainer.coevolution.state.observe_count == 2  # the faulted episodes were not observed
    assert first not in trainer.coevolution.state.tasks


def test_too_many_faults_stop_the_run(tmp_path, make_trainer, scripted_runner):
    runner = scripted_runner()
    trainer, _ = make_trainer(tmp_path / "run", runner=runner, extra=["seal.local.max_fault_fraction=0.25"])
    try:
        runner.faults = {t: -1 for t in trainer.sampler.permutation(0)[:1]}
        with pytest.raises(EnvFaultError, match="max_fault_fraction=0.25"):
            trainer.train_step()
        assert trainer.coevolution.state.observe_count == 0
    finally:
        trainer.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_service():
    """A real HTTP environment service in a child process (this test stops it on purpose)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "0", "--log-level", "warning"], cwd=REPO_ROOT)
    from env_service.client import EnvClient

    url = f"http://127.0.0.1:{port}"
    client = EnvClient(url, timeout_s=2.0, retries=0)
    deadline = time.monotonic() + 60
    while not client.healthz():
        assert proc.poll() is None and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.3)
    client.close()
    yield url, proc
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_service_stopped_mid_run(tmp_path, tokenizer, make_model, trainer_config, http_service):
    """Real runner and HTTP service: step 1 trains; the service dies; step 2's episodes are retried
    once by the runner, counted as environment faults, and the run stops with a clear message."""
    from seal.trainer.local import LocalTrainer

    url, proc = http_service
    cfg = trainer_config("faults", [
        f"env_service.url={url}", f"seal.tasks.train_ids=[{TASK},{TASK}]", f"seal.tasks.val_ids=[{TASK}]",
        "seal.rollout.max_llm_calls=2", "seal.rollout.max_tokens_per_call=8", "seal.rollout.few_shot=false",
        "env_service.timeout_s=5.0", "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    ])
    trainer = LocalTrainer(cfg, tmp_path / "faults", model=make_model(), tokenizer=tokenizer)
    try:
        first = trainer.train_step()
        assert first["seal/env_faults"] == 0.0 and first["seal/episodes"] == 2.0
        observed = trainer.coevolution.state.observe_count
        proc.terminate()
        proc.wait(timeout=30)
        seen = []
        real_check = trainer.check_faults
        trainer.check_faults = lambda eps, step: (seen.extend(eps), real_check(eps, step))[1]
        with pytest.raises(EnvFaultError, match="2 of 2 episodes faulted") as info:
            trainer.train_step()
        assert url in str(info.value)
        assert [(e.env_fault, e.result.env_attempts, e.trainable) for e in seen] == [(True, 2, False)] * 2  # retried once
        assert trainer.coevolution.state.observe_count == observed
    finally:
        trainer.close()


def test_a_step_with_nothing_to_train_on_is_skipped(tmp_path, make_trainer, scripted_runner):
    """Every episode faults (tolerated by max_fault_fraction=1): no update, no crash, counted."""
    import torch

    runner = scripted_runner()
    trainer, _ = make_trainer(tmp_path / "run", runner=runner,
                              extra=["trainer.val_before_train=false", "seal.local.max_fault_fraction=1.0"])
    try:
        runner.faults = {t: -1 for t in trainer.sampler.permutation(0)}
        before = [p.detach().clone() for p in trainer.model.parameters()]
        metrics = trainer.train_step()
        after = list(trainer.model.parameters())
    finally:
        trainer.close()
    assert metrics["seal/skipped_updates"] == 1.0 and metrics["seal/trained_episodes"] == 0.0
    assert metrics["seal/excluded_episodes"] == 4.0 and trainer.global_step == 1
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert not trainer.optimizer.state  # AdamW never stepped


def test_a_lone_survivor_is_not_trained_on(tmp_path, make_trainer, scripted_runner):
    """n=2 and one episode of a task faults: its sibling has no baseline and is left out (as on
    the verl backend), but it is still observed by the capability state."""
    runner = scripted_runner()
    trainer, _ = make_trainer(tmp_path / "run", runner=runner, extra=["trainer.val_before_train=false"])
    try:
        first = trainer.sampler.permutation(0)[0]
        runner.faults = {first: 1}  # the first attempt of the task faults, the second does not
        metrics = trainer.train_step()
    finally:
        trainer.close()
    assert metrics["seal/lone_survivors"] == 1.0 and metrics["seal/trained_episodes"] == 2.0
    assert trainer.coevolution.state.tasks[first]["count"] == 1
