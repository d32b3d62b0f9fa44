"""launcher.py: argument parsing, config errors, run files, .env, backend dispatch, --with-bfcl."""

from __future__ import annotations

import os
import socket
import sys

import pytest
from omegaconf import OmegaConf

import launcher


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def recorded(monkeypatch):
    """Replace the local backend by a recorder of its arguments."""
    import seal.trainer.local as local

    calls = []
    monkeypatch.setattr(local, "run_local", lambda cfg, *, exp_dir: calls.append((cfg, exp_dir)))
    return calls


def test_overrides_after_dashes_or_bare():
    args, over = launcher.parse_args(["--conf", "exp/quickstart_bfcl.yaml", "--", "a.b=1", "c=x"])
    assert args.conf == "exp/quickstart_bfcl.yaml" and over == ["a.b=1", "c=x"]
    _, over = launcher.parse_args(["--conf", "exp/quickstart_bfcl.yaml", "a.b=1"])
    assert over == ["a.b=1"]
    with pytest.raises(SystemExit):
        launcher.parse_args(["--conf", "exp/quickstart_bfcl.yaml", "--", "not_an_override"])


def test_bad_key_fails_with_one_line(in_tmp, capsys, recorded):
    conf = str(launcher.REPO_ROOT / "exp" / "quickstart_bfcl.yaml")
    assert launcher.main(["--conf", conf, "--", "seal.local.devise=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seal.local.devise" in err
    assert launcher.main(["--conf", conf, "--", "seal.local.max_fault_fraction=lots"]) == 2
    assert "seal.local.max_fault_fraction" in capsys.readouterr().err
    assert recorded == [] and not (in_tmp / "experiments").exists()


def test_local_run_files_env_and_in_process_service(in_tmp, recorded, monkeypatch):
    monkeypatch.delenv("SEAL_LAUNCHER_TEST", raising=False)
    (in_tmp / ".env").write_text("SEAL_LAUNCHER_TEST=from-dotenv\n")
    conf = str(launcher.REPO_ROOT / "exp" / "quickstart_bfcl.yaml")
    try:
        assert launcher.main(["--conf", conf, "trainer.experiment_name=demo", "data.seed=7"]) == 0
        assert os.environ["SEAL_LAUNCHER_TEST"] == "from-dotenv"
    finally:
        os.environ.pop("SEAL_LAUNCHER_TEST", None)
    (cfg, exp_dir), = recorded
    assert exp_dir.as_posix() == "experiments/demo"
    assert cfg.env_service.url is None  # no --with-bfcl: the local backend embeds the service
    saved = OmegaConf.load(in_tmp / "experiments" / "demo" / "config.yaml")
    assert saved.data.seed == 7 and saved.trainer.backend == "local" and saved.env_service.url is None
    overrides = (in_tmp / "experiments" / "demo" / "overrides.txt").read_text().splitlines()
    assert overrides[1:] == ["trainer.experiment_name=demo", "data.seed=7"]
    commit = (in_tmp / "experiments" / "demo" / "git_commit.txt").read_text().strip()
    assert commit == "unknown" or len(commit.split()[0]) == 40


def test_verl_backend_missing_is_a_clear_error(in_tmp, monkeypatch):
    monkeypatch.setitem(sys.modules, "seal.trainer.verl", None)  # import fails
    conf = str(launcher.REPO_ROOT / "exp" / "quickstart_bfcl.yaml")
    with pytest.raises(SystemExit, match="seal.trainer.verl.run_verl"):
        launcher.main(["--conf", conf, "--", "trainer.backend=verl", "trainer.n_gpus_per_node=1"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_with_bfcl_starts_and_stops_the_service(in_tmp, monkeypatch):
    import seal.trainer.local as local

    url = f"http://127.0.0.1:{_free_port()}"
    seen = []
    monkeypatch.setattr(local, "run_local", lambda cfg, *, exp_dir: seen.append(launcher._healthy(cfg.env_service.url)))
    conf = str(launcher.REPO_ROOT / "exp" / "quickstart_bfcl.yaml")
    assert launcher.main(["--conf", conf, "--with-bfcl", "--", f"env_service.url={url}"]) == 0
    assert seen == [True]  # up while the trainer ran ...
    assert not launcher._healthy(url)  # ... and stopped afterwards
