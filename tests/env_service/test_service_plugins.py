"""``python -m env_service --plugin MODULE``: a research failure tag registered by a plug-in module
tags the episodes the service's worker processes check (docs/extending.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from env_service.client import EnvClient
from env_service.bfcl.episode import BfclEpisode
from env_service.kit.oracle import ORACLE_REPLY, tool_call_message
from live_service import free_port

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "tests" / "seal"  # example_plugins.py: the tag "missed_tool"


def _episode_tags(url: str) -> list[str]:
    with EnvClient(url) as client:
        created = client.create("multi_turn_base_0")
        # Turn 0 needs cd, mkdir and mv; the model only makes the folder, then stops every turn.
        client.step(created.instance_id, tool_call_message(["mkdir(dir_name='temp')"], BfclEpisode.tool_parameters()))
        for _ in range(4):
            client.step(created.instance_id, ORACLE_REPLY)
        result = client.evaluate(created.instance_id, sparse=False)
        client.release(created.instance_id)
    return result["failure_tags"]


def _serve(*plugin_args: str) -> tuple[str, subprocess.Popen]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--port", str(port), "--workers", "1",
                             "--log-level", "warning", *plugin_args], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    with EnvClient(url) as probe:
        deadline = time.monotonic() + 90
        while not probe.healthz():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no /healthz within 90 s"
            time.sleep(0.1)
    return url, proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=20)


def test_worker_processes_tag_with_the_plugin() -> None:
    url, proc = _serve("--plugin", "example_plugins")
    try:
        assert _episode_tags(url)[0] == "missed_tool"
    finally:
        _stop(proc)
    url, proc = _serve()
    try:
        assert _episode_tags(url)[0] == "state_mismatch"  # the same episode without the plug-in
    finally:
        _stop(proc)


def test_an_unknown_plugin_module_is_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "env_service", "--port", "0", "--plugin", "no_such_plugin_module"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1].startswith("python -m env_service: seal.plugins: cannot import")


def test_the_launcher_passes_seal_plugins_to_the_service_it_starts(monkeypatch, tmp_path) -> None:
    import launcher
    import seal.trainer.local as local
    from seal.advantage.registry import unregister_reweighter
    from seal_shared.tags import unregister_tag

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))  # the trainer side imports it from seal.plugins
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]))
    seen = []
    monkeypatch.setattr(local, "run_local", lambda cfg, *, exp_dir: seen.append(_episode_tags(cfg.env_service.url)))
    url = f"http://127.0.0.1:{free_port()}"
    conf = str(ROOT / "exp" / "quickstart_bfcl.yaml")
    try:
        assert launcher.main(["--conf", conf, "--with-env", "--", f"env_service.url={url}",
                              "seal.plugins=[example_plugins]"]) == 0
    finally:
        unregister_tag("missed_tool")
        unregister_reweighter("failure_boost")
        sys.modules.pop("example_plugins", None)
    assert seen[0][0] == "missed_tool"
