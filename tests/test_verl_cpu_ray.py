"""verl's own trainer under a real local Ray cluster, on the verl backend's CPU platform
(exp/verl_cpu.yaml with a tiny model), driven by the GPU smoke script with ``--cpu``: its two
phases, with both faults a long run meets (a dead environment service, a killed Ray worker) in
the first, so that two verl launches cover what four would otherwise (each launch is a Ray
cluster's start-up, about two minutes of these two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_gpu_smoke import MODEL_DIR, SCRIPT, _free_port, _tiny_model


def _smoke(cwd: Path, args: list[str], log: Path) -> subprocess.Popen:
    """The smoke script, its output into ``log``; verl's file logger writes each step's metrics to
    ``<log>.jsonl`` as the trainer (a Ray actor) ends the step; the console line reaches ``log``
    later, through Ray's log forwarding."""
    env = {**os.environ, "PYTHON": sys.executable, "VERL_FILE_LOGGER_PATH": str(log.with_suffix(".jsonl"))}
    env.pop("SMOKE_BACKEND", None)
    return subprocess.Popen(["bash", str(SCRIPT), *args], cwd=cwd, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def _descendants(run: subprocess.Popen, marker: str) -> list[psutil.Process]:
    """The processes under ``run`` (the script, its launcher, the launcher's Ray cluster and
    service) whose command line holds ``marker``: this run's own, never another run's."""
    found = []
    for proc in psutil.Process(run.pid).children(recursive=True):
        try:
            if marker in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            pass
    return found


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _kill_service(run: subprocess.Popen) -> None:
    """SIGKILL the environment service the launcher started (``--with-env``) and its workers."""
    services = _descendants(run, "-m env_service")
    assert services, "no environment service process of this run to kill"
    _kill([child for proc in services for child in proc.children(recursive=True)] + services)


def _kill_verl_worker(run: subprocess.Popen) -> None:
    """SIGKILL verl's actor worker of this run."""
    workers = _descendants(run, "ray::WorkerDict")
    assert workers, "no verl worker process of this run to kill"
    _kill(workers)


def _stop_tree(run: subprocess.Popen) -> None:
    """Whatever of ``run`` is still alive after a failed assertion: the script and all under it."""
    if run.poll() is None:
        _kill(psutil.Process(run.pid).children(recursive=True) + [psutil.Process(run.pid)])
        run.wait(timeout=30)


def _observe_count(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "seal" / "capability_state.json").read_text())["observe_count"])


def _tracker(exp: Path) -> int:
    path = exp / "checkpoints" / "latest_checkpointed_iteration.txt"
    return int(path.read_text().strip()) if path.is_file() else 0


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 1200) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _steps(log: Path) -> dict[int, dict[str, float]]:
    """Each logged step's metrics, from the run's file logger (see :func:`_smoke`)."""
    path = log.with_suffix(".jsonl")
    finished = path.read_text().split("\n")[:-1] if path.is_file() else []  # a line being written is not yet one
    records = [json.loads(line) for line in finished if line.strip()]
    steps = [int(r["step"]) for r in records]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {int(r["step"]): r["data"] for r in records}


@pytest.mark.slow
@pytest.mark.ray
def test_the_cpu_smoke_runs_verls_own_fit_under_ray_through_a_killed_service_and_worker(tmp_path: Path) -> None:
    """The GPU smoke script's whole path with ``--cpu``, on a tiny model: a real local Ray cluster,
    verl's RayPPOTrainer.fit with the FSDP2 actor and reference worker on gloo, the agent-loop
    worker playing the seal agent loop against the HTTP service, the seal_cpu rollout replica.
    Its first run meets both faults:

    1. the environment service is killed once the validation before training is written: step 1's
       episodes are excluded and counted (``seal/env_faults``), its update skipped and counted,
       its checkpoint written, with nothing observed;
    2. verl's actor worker (a Ray actor process) is killed once step 1 is logged: the run stops
       with one line naming the failure and the checkpoint to continue from.

    The script's resume phase then continues from checkpoint 1 with a fresh service: steps 2 and
    3 only (no step lost or repeated), validation at 2 and 3, and every output check PASS. (The
    script's checker assumes its own resume point, step 2; that the seal state a verl checkpoint
    holds comes back on resume is tested in tests/seal/trainer/verl/test_verl_trainer_hook.py.)"""
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    logs, exp = tmp_path / "logs", tmp_path / "experiments" / "smoke"
    args = ["--cpu", "--name", "smoke", "--out", str(logs), "--port", str(_free_port()),
            "--model", str(_tiny_model(tmp_path / "tiny_model"))]
    # Four training tasks, two a step: an epoch is two steps, so the faulted step 1 does not leave
    # an epoch without a task (the checker wants every epoch's statistics to hold some).
    extra = ["--", "seal.rollout.env_retries=0", "seal.tasks.max_train_tasks=4", "trainer.logger=[console,file]"]

    train = _smoke(tmp_path, [*args, "--phase", "train", *extra], tmp_path / "train.log")
    try:
        _wait_for(lambda: (exp / "validation_log" / "0.jsonl").is_file(), train, "the validation before training")
        _kill_service(train)  # step 1 plays against a dead service
        # Step 1's record is written after everything step 1 does with the workers (its checkpoint,
        # the weight sync); step 2 needs the actor worker again before its own checkpoint.
        _wait_for(lambda: 1 in _steps(tmp_path / "train.log"), train, "step 1's metrics")
        _kill_verl_worker(train)
        train.wait(timeout=900)
    finally:
        _stop_tree(train)
    out = (tmp_path / "train.log").read_text()
    assert train.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: the verl run stopped:"), out[-3000:]
    assert "continue from checkpoint step 1 with trainer.resume_mode=auto" in errors[0]
    first = _steps(tmp_path / "train.log")
    assert sorted(first) == [0, 1], sorted(first)
    assert first[1]["seal/env_faults"] == 4.0 and first[1]["seal/skipped_updates"] == 1.0
    assert _observe_count(exp / "checkpoints" / "global_step_1") == 0  # the faulted episodes taught nothing
    assert "Started a local Ray instance" in out and "verl on the CPU platform" in out

    resume = _smoke(tmp_path, [*args, "--phase", "resume", *extra], tmp_path / "resume.log")
    try:
        # About 4 minutes on two idle cores; the limits are for a machine that is busy with more.
        resume.wait(timeout=1800)
    finally:
        _stop_tree(resume)
    out = (tmp_path / "resume.log").read_text()
    assert resume.returncode == 0, out[-6000:]
    results = [line for line in out.splitlines() if line.startswith(("PASS  ", "FAIL  "))]
    assert results and all(line.startswith("PASS  ") for line in results), "\n".join(results)
    assert {"validation log step 0", "validation log step 2", "validation log step 3", "capability state",
            "checkpoint step 1", "checkpoint step 2", "checkpoint step 3", "resume tracker"} <= {
        line[6:].split(":")[0] for line in results}
    second = _steps(tmp_path / "resume.log")
    assert sorted(second) == [2, 3], sorted(second)
    # What the user reads: the last step's console line, forwarded from the trainer's Ray actor.
    assert "step:3 - " in out
    assert all(second[k]["seal/env_faults"] == 0.0 and second[k]["seal/observed_episodes"] == 4.0 for k in (2, 3))
    assert _tracker(exp) == 3 and (exp / "checkpoints" / "global_step_3" / "actor").is_dir()
    assert _observe_count(exp / "checkpoints" / "global_step_3") == 8
