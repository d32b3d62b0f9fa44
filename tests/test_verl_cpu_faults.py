"""Faults under Ray, on the verl backend's CPU platform (exp/verl_cpu.yaml with a tiny model).

One run meets both faults, then a resume finishes it:

1. the environment service is killed while step 2 plays its episodes: the step completes with
   those episodes excluded and counted (``seal/env_faults``), its update skipped and counted,
   and its checkpoint written; the service is started again;
2. verl's actor worker (a Ray actor process) is killed during step 3: the run stops with one
   line naming the failure and the checkpoint to continue from;
3. ``trainer.resume_mode=auto`` continues from checkpoint 2 and runs step 3 only: no step lost
   or repeated.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_gpu_smoke import MODEL_DIR, _free_port, _tiny_model

from seal.config import REPO_ROOT

STEP_LINE = re.compile(r"step:(\d+) - (.*)")


def _metric(line: str, key: str) -> float | None:
    found = re.search(rf"(?:^| - ){re.escape(key)}:(?:np\.float64\()?([-0-9.e]+)", line)
    return float(found.group(1)) if found else None


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
    return subprocess.Popen([sys.executable, str(REPO_ROOT / "launcher.py"), "--conf",
                             str(REPO_ROOT / "exp" / "verl_cpu.yaml"), "--", *overrides],
                            cwd=cwd, stdout=log.open("w"), stderr=subprocess.PIPE, text=True)


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _steps(log: Path) -> dict[int, str]:
    lines = [m for m in map(STEP_LINE.search, log.read_text().splitlines()) if m]
    steps = [int(m.group(1)) for m in lines]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {int(m.group(1)): m.group(2) for m in lines}


@pytest.mark.slow
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
        _wait_for(lambda: _tracker(exp) >= 2, run, "checkpoint 2")
        service = _start_service(port, service_log)
        time.sleep(2)  # step 3 is under way (generation against the restored service)
        worker = subprocess.run(["pkill", "-9", "-f", "ray::WorkerDict"], capture_output=True)
        assert worker.returncode == 0, "no verl worker process to kill"
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 1, stderr[-3000:]
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: the verl run stopped:"), stderr[-3000:]
        assert "continue from checkpoint step 2 with trainer.resume_mode=auto" in errors[0]
        first = _steps(tmp_path / "run.log")
        assert sorted(first) == [1, 2], sorted(first)
        assert _metric(first[2], "seal/env_faults") == 4.0 and _metric(first[2], "seal/skipped_updates") == 1.0
        assert _metric(first[1], "seal/env_faults") == 0.0

        resumed = _launch(tmp_path, [*overrides, "trainer.resume_mode=auto"], tmp_path / "resume.log")
        _, stderr = resumed.communicate(timeout=600)
        assert resumed.returncode == 0, stderr[-3000:]
        second = _steps(tmp_path / "resume.log")
        assert sorted(second) == [3], sorted(second)
        assert _metric(second[3], "seal/env_faults") == 0.0 and _metric(second[3], "seal/observed_episodes") == 4.0
        assert _tracker(exp) == 3
    finally:
        _stop(service)
