"""verl's own trainer under a real local Ray cluster, on the verl backend's CPU platform
(exp/verl_cpu.yaml with a tiny model): the GPU smoke script's whole path with ``--cpu``, and faults.

These tests share one file so that pytest-xdist (``--dist loadfile``) runs them one after another:
two verl runs at once would split the two cores between their Ray clusters.

The fault test: one run meets both faults, then a resume finishes it:

1. the environment service is killed while step 2 plays its episodes: the step completes with
   those episodes excluded and counted (``seal/env_faults``), its update skipped and counted,
   and its checkpoint written;
2. verl's actor worker (a Ray actor process) is killed as step 3 begins: the run stops with one
   line naming the failure and the checkpoint to continue from; the service is started again;
3. ``trainer.resume_mode=auto`` continues from checkpoint 2 and runs step 3 only: no step lost
   or repeated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from test_gpu_smoke import MODEL_DIR, _free_port, _tiny_model, run_smoke

from seal.config import REPO_ROOT


def _start_service(port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--env", "notes", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], cwd=REPO_ROOT, stdout=log.open("a"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"the environment service did not start: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _tracker(exp: Path) -> int:
    path = exp / "checkpoints" / "latest_checkpointed_iteration.txt"
    return int(path.read_text().strip()) if path.is_file() else 0


def _launch(cwd: Path, overrides: list[str], log: Path) -> subprocess.Popen:
    """The launcher, with verl's file logger writing each step's metrics to ``<log>.jsonl`` as the
    trainer (a Ray actor) ends the step; its console line reaches ``log`` later, through Ray's log
    forwarding."""
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(log.with_suffix(".jsonl"))}
    return subprocess.Popen([sys.executable, str(REPO_ROOT / "launcher.py"), "--conf",
                             str(REPO_ROOT / "exp" / "verl_cpu.yaml"), "--", *overrides, "trainer.logger=[console,file]"],
                            cwd=cwd, stdout=log.open("w"), stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _kill_verl_worker(run: subprocess.Popen) -> None:
    """SIGKILL verl's actor worker of this run: a process of the run's own Ray cluster (the
    launcher starts it, so its workers descend from the launcher), never another run's."""
    workers = []
    for proc in psutil.Process(run.pid).children(recursive=True):
        try:
            if "ray::WorkerDict" in " ".join(proc.cmdline()):
                workers.append(proc)
        except psutil.Error:
            pass
    assert workers, "no verl worker process of this run to kill"
    for proc in workers:
        proc.kill()


def _steps(log: Path) -> dict[int, dict[str, float]]:
    """Each logged step's metrics, from the run's file logger (see :func:`_launch`)."""
    path = log.with_suffix(".jsonl")
    finished = path.read_text().split("\n")[:-1] if path.is_file() else []  # a line being written is not yet one
    records = [json.loads(line) for line in finished if line.strip()]
    steps = [int(r["step"]) for r in records]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {int(r["step"]): r["data"] for r in records}


@pytest.mark.slow
@pytest.mark.ray
def test_a_killed_service_and_a_killed_ray_worker_lose_no_step(tmp_path: Path) -> None:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    model = _tiny_model(tmp_path / "tiny_model")
    port = _free_port()
    service_log = tmp_path / "service.log"
    overrides = ["trainer.experiment_name=faults", f"actor_rollout_ref.model.path={model}",
                 f"env_service.url=http://127.0.0.1:{port}", "trainer.total_training_steps=3",
                 "trainer.val_before_train=false", "trainer.test_freq=0", "seal.rollout.env_retries=0"]
    exp = tmp_path / "experiments" / "faults"
    service = _start_service(port, service_log)
    try:
        run = _launch(tmp_path, overrides, tmp_path / "run.log")
        _wait_for(lambda: _tracker(exp) >= 1, run, "checkpoint 1")
        _stop(service)  # step 2 plays against a dead service
        # Step 2's record is written after everything step 2 does with the workers (its checkpoint,
        # the weight sync); step 3 needs the actor worker again before its own checkpoint.
        _wait_for(lambda: 2 in _steps(tmp_path / "run.log"), run, "step 2's metrics")
        _kill_verl_worker(run)
        service = _start_service(port, service_log)  # for the resume
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 1, stderr[-3000:]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: the verl run stopped:"), stderr[-3000:]
        assert "continue from checkpoint step 2 with trainer.resume_mode=auto" in errors[0]
        first = _steps(tmp_path / "run.log")
        assert sorted(first) == [1, 2], sorted(first)
        assert first[2]["seal/env_faults"] == 4.0 and first[2]["seal/skipped_updates"] == 1.0
        assert first[1]["seal/env_faults"] == 0.0

        resumed = _launch(tmp_path, [*overrides, "trainer.resume_mode=auto"], tmp_path / "resume.log")
        _, stderr = resumed.communicate(timeout=600)
        assert resumed.returncode == 0, stderr[-3000:]
        second = _steps(tmp_path / "resume.log")
        assert sorted(second) == [3], sorted(second)
        # What the user reads: the last step's console line, forwarded from the trainer's Ray actor.
        assert "step:3 - " in (tmp_path / "resume.log").read_text()
        assert second[3]["seal/env_faults"] == 0.0 and second[3]["seal/observed_episodes"] == 4.0
        assert _tracker(exp) == 3
    finally:
        _stop(service)


@pytest.mark.slow
@pytest.mark.ray
def test_the_cpu_smoke_runs_verls_own_fit_under_ray(tmp_path):
    """``--cpu``: the verl backend as one program on this machine (exp/verl_cpu.yaml with a tiny
    model): a real local Ray cluster, verl's RayPPOTrainer.fit with the FSDP2 actor and reference
    worker on gloo, the agent-loop worker playing the seal agent loop against the HTTP service,
    the seal_cpu rollout replica; validation, two steps with a checkpoint each, a resume for the
    third, and every output check PASS."""
    _, names, logs = run_smoke(["--cpu"], tmp_path, timeout=1200)
    assert {"validation log step 0", "validation log step 2", "validation log step 3", "capability state",
            "checkpoint step 1", "checkpoint step 2", "checkpoint step 3", "resume tracker"} <= names, names
    train_log = (logs / "smoke_train.log").read_text()
    assert "Started a local Ray instance" in train_log and "verl on the CPU platform" in train_log
    exp = tmp_path / "experiments" / "smoke"
    assert (exp / "checkpoints" / "global_step_3" / "actor").is_dir()
