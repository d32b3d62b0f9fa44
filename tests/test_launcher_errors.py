"""launcher.py's expected failures: one line, no traceback; complete runs say so; the service dies
with the launcher; an explicit env_service.url is honoured on the local backend."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import launcher

CONF = str(launcher.REPO_ROOT / "exp" / "quickstart_bfcl.yaml")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def dispatched(monkeypatch):
    calls = []
    monkeypatch.setattr(launcher, "dispatch", lambda cfg, exp_dir: calls.append((cfg, exp_dir)))
    return calls


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wrong_type_from_the_command_line_is_one_line_without_traceback(in_tmp):
    proc = subprocess.run([sys.executable, str(launcher.REPO_ROOT / "launcher.py"), "--conf", CONF, "--",
                           "data.train_batch_size=abc"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SEAL_DEBUG": ""})
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["error: data.train_batch_size=abc: expected int (fix: a whole number, e.g. "
                      "data.train_batch_size=1024)"]
    assert "Traceback" not in proc.stderr and not (in_tmp / "experiments").exists()


@pytest.mark.parametrize("override, start", [
    ("trainer.total_trainin_steps=1", "error: trainer.total_trainin_steps: no such config key (did you mean "
                                      "trainer.total_training_steps?"),
    ("seal.tasks.train_ids=[multi_turn_base_99999]", "error: seal.tasks.train_ids: task id 'multi_turn_base_99999'"),
    ("data.train_files=data/nope.parquet", "error: data.train_files=data/nope.parquet: file not found"),
])
def test_config_errors_exit_2_with_one_line(in_tmp, capsys, dispatched, override, start):
    assert launcher.main(["--conf", CONF, "--", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(start)
    assert dispatched == []


def test_debug_flag_keeps_the_traceback(in_tmp, dispatched):
    from seal.config import ConfigError

    with pytest.raises(ConfigError):
        launcher.main(["--conf", CONF, "--debug", "--", "data.train_batch_size=abc"])


def _finished_local_run(root: Path, name: str, step: int, num_tasks: int) -> Path:
    ckpt = root / "experiments" / name / "checkpoints"
    (ckpt / f"global_step_{step}").mkdir(parents=True)
    (ckpt / f"global_step_{step}" / "trainer_state.json").write_text(
        json.dumps({"global_step": step, "data": {"epoch": 1, "index": 0, "seed": 1, "num_tasks": num_tasks}}))
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))
    return ckpt


def test_rerunning_a_complete_local_run_says_so_and_exits_0(in_tmp, capsys, dispatched):
    # quickstart_bfcl: 2 training tasks, batch 1, 1 epoch = 2 steps.
    _finished_local_run(in_tmp, "quickstart_bfcl", 2, 2)
    (in_tmp / "experiments" / "quickstart_bfcl" / "config.yaml").write_text("kept: true\n")
    assert launcher.main(["--conf", CONF]) == 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "experiment quickstart_bfcl is already complete (2 of 2" in err
    assert "trainer.experiment_name" in err and "trainer.resume_mode=disable" in err
    assert dispatched == []
    assert (in_tmp / "experiments" / "quickstart_bfcl" / "config.yaml").read_text() == "kept: true\n"
    # More steps than were run, or resume disabled: the run goes ahead.
    assert launcher.main(["--conf", CONF, "trainer.total_training_steps=3"]) == 0
    assert launcher.main(["--conf", CONF, "trainer.resume_mode=disable"]) == 0
    assert len(dispatched) == 2


def test_half_done_local_run_resumes(in_tmp, dispatched):
    _finished_local_run(in_tmp, "quickstart_bfcl", 1, 2)
    assert launcher.main(["--conf", CONF]) == 0 and len(dispatched) == 1


def test_rerunning_a_complete_verl_run_is_read_from_the_tracker(in_tmp, capsys, dispatched):
    (in_tmp / "ck").mkdir()
    (in_tmp / "ck" / "latest_checkpointed_iteration.txt").write_text("2")
    # One GPU: quickstart_bfcl's 1 task x 2 episodes per step cannot be spread over more.
    args = ["--conf", CONF, "--", "trainer.backend=verl", "trainer.n_gpus_per_node=1",
            f"trainer.default_local_dir={in_tmp / 'ck'}"]
    assert launcher.main(args) == 0
    assert "already complete (2 of 2 training steps" in capsys.readouterr().err
    assert dispatched == []


def test_explicit_service_url_on_local_backend_is_used_and_must_answer(in_tmp, capsys, dispatched):
    url = f"http://127.0.0.1:{_free_port()}"
    assert launcher.main(["--conf", CONF, "--", f"env_service.url={url}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: env_service.url={url}: nothing answers there") and dispatched == []


def test_default_service_url_on_local_backend_is_in_process(in_tmp, dispatched):
    assert launcher.main(["--conf", CONF]) == 0
    (cfg, _), = dispatched
    assert cfg.env_service.url is None


def _answers(url: str) -> bool:
    return launcher._healthy(url)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_launcher_takes_its_service_down(in_tmp, sig):
    url = f"http://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen([sys.executable, str(launcher.REPO_ROOT / "launcher.py"), "--conf", CONF, "--with-bfcl",
                             "--", f"env_service.url={url}", "trainer.experiment_name=killed"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not _answers(url):
            assert proc.poll() is None, "the launcher exited before its service answered"
            assert time.monotonic() < deadline, "the service never answered"
            time.sleep(0.5)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while _answers(url):
            assert time.monotonic() < deadline, f"the service outlived the launcher ({sig.name}) by 10 s"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
