"""An environment defined outside the project (``tests/plugins/home_env.py``) plugs in through
``seal.plugins`` / ``--plugin`` only: the service CLI serves it over HTTP, the config, the in-process
client, the launcher's ``--with-env`` and ``seal eval --conf`` accept it, a run records its code,
and an unknown name says how to plug one in. No file of the project names ``home``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from env_service.client import EnvClient
from env_service.registry import known_environments, unregister_environment
from live_service import free_port, running_service

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "tests" / "plugins"
CONF = str(PLUGIN_DIR / "home.yaml")


@pytest.fixture
def home(import_plugin) -> ModuleType:
    """``home_env`` importable (on sys.path only: no PYTHONPATH), imported fresh, unregistered after."""
    return import_plugin("home_env", "home")


def play(client: EnvClient, module: ModuleType, task_id: str, replies: list[str] | None = None) -> tuple[float, dict]:
    """Play ``replies`` (default: the ground truth) on a fresh episode; ``(last reward, evaluation)``."""
    created = client.create(task_id, {"rollout_mode": "validate"})
    reward = 0.0
    for reply in module.oracle_replies(task_id) if replies is None else replies:
        reward = client.step(created.instance_id, reply).reward
    result = client.evaluate(created.instance_id, sparse=False)
    client.release(created.instance_id)
    return reward, result


def test_the_service_cli_serves_a_plugin_environment_over_http(home: ModuleType,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]))
    with running_service("--plugin", "home_env", "--env", "home", workers=1) as (url, _), EnvClient(url) as client:
        assert client.get_env_profile("val") == ["home_4", "home_5"]
        for task_id in home.TASKS:
            reward, result = play(client, home, task_id)
            assert reward == 1.0 and result["valid"] is True, (task_id, result)
        reward, result = play(client, home, "home_0", ["Done.", "Done."])
        assert reward == 0.0 and result["failure_tags"] == ["empty_turn_model_response"] * 2


def test_an_unknown_environment_names_the_plugin_route() -> None:
    from seal.config import ConfigError, compose_config

    out = subprocess.run([sys.executable, "-m", "env_service", "--env", "home", "--port", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    line = out.stderr.strip().splitlines()[-1]
    assert out.returncode != 0 and line.startswith("python -m env_service: unknown environment 'home'"), line
    assert "seal.plugins" in line and "--plugin" in line
    assert "home" not in known_environments()
    with pytest.raises(ConfigError, match=r"env_service.env=home: unknown environment .*fix: .*seal.plugins"):
        compose_config(CONF, ["seal.plugins=[]"])


def test_config_and_in_process_client_accept_a_plugin_environment(home: ModuleType) -> None:
    from seal.config import compose_config
    from seal.environment import task_categories
    from seal.environment import make_env_client

    cfg = compose_config(CONF, ["env_service.url=null"])
    assert task_categories(cfg, ["home_0", "home_2"]) == {"home_0": "climate", "home_2": "lights"}
    client = make_env_client(cfg)
    try:
        assert all(play(client, home, t)[0] == 1.0 for t in client.get_env_profile("train"))
    finally:
        client.close()
    unregister_environment("home")  # the client's own plugins= loads it back
    sys.modules.pop("home_env", None)
    with EnvClient.in_process(env="home", plugins=["home_env"]) as client:
        assert client.get_env_profile("val") == ["home_4", "home_5"]


def test_the_launcher_starts_a_service_of_a_plugin_environment(home: ModuleType, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher imports the plug-in from seal.plugins and starts ``python -m env_service
    --plugin home_env --env home`` with the plug-in's folder on its PYTHONPATH; the run records
    the plug-in's code beside git_commit.txt."""
    import launcher
    import seal.trainer.local as local

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    url = f"http://127.0.0.1:{free_port()}"
    seen: list[Any] = []

    def probe(cfg: Any, *, exp_dir: Path) -> None:
        with EnvClient(cfg.env_service.url) as client:
            seen.append(client.get_env_profile("val"))
            seen.append(play(client, home, "home_4")[0])

    monkeypatch.setattr(local, "run_local", probe)
    assert launcher.main(["--conf", CONF, "--with-env", "--", f"env_service.url={url}"]) == 0
    assert seen == [["home_4", "home_5"], 1.0]
    assert not launcher._healthy(url)
    exp = tmp_path / "experiments" / "home_plugin"
    (record,) = json.loads((exp / "plugins.json").read_text())
    import hashlib

    source = PLUGIN_DIR / "home_env.py"
    assert record["module"] == "home_env" and Path(record["file"]) == source.resolve()
    assert record["sha256"] == hashlib.sha256(b"home_env.py\0" + source.read_bytes() + b"\0").hexdigest()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert record["git_commit"] == head and isinstance(record["git_dirty"], bool)
    assert (exp / "git_commit.txt").is_file()


def _oracle_endpoint(module: ModuleType) -> Iterator[str]:
    """An OpenAI-compatible chat server that plays the home tasks' ground truth."""
    import uvicorn
    from fastapi import FastAPI

    by_first = {t.users[0]: t.id for t in module.TASKS.values()}
    app = FastAPI()

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        replies = module.oracle_replies(by_first[messages[1]["content"]])
        done = sum(1 for m in messages if m["role"] == "assistant")
        text = replies[done] if done < len(replies) else "Done."
        return {"id": "x", "object": "chat.completion", "model": "oracle",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10}}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_seal_eval_with_conf_plays_a_plugin_environment(home: ModuleType, tmp_path: Path) -> None:
    from seal.cli import main as seal_main

    endpoint = _oracle_endpoint(home)
    url = next(endpoint)
    try:
        rc = seal_main(["eval", "--endpoint", url, "--served-model", "oracle", "--conf", CONF, "--split", "val",
                        "--set", "seal.rollout.max_llm_calls=6", "--out", str(tmp_path / "eval"), "--no-progress",
                        "--concurrency", "2"])
    finally:
        next(endpoint, None)
    assert rc == 0
    summary = json.loads((tmp_path / "eval" / "eval_summary.json").read_text())
    assert summary["repeats"][0]["counts"]["overall"] == {"n_pass": 2, "n": 2, "errored": 0}


@pytest.mark.slow
def test_two_training_steps_through_the_launcher_with_env(tmp_path: Path) -> None:
    """The plug-in's whole path through the launcher, on a tiny model with SmolLM2's tokenizer:
    what is tested is the plumbing (the real model's launcher run is tests/test_notes_example.py)."""
    from test_gpu_smoke import MODEL_DIR, _tiny_model

    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")])}
    url = f"http://127.0.0.1:{free_port()}"
    model = _tiny_model(tmp_path / "tiny_model")
    proc = subprocess.run([sys.executable, str(ROOT / "launcher.py"), "--conf", CONF, "--with-env", "--",
                           f"env_service.url={url}", f"actor_rollout_ref.model.path={model}"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exp = tmp_path / "experiments" / "home_plugin"
    steps = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "step" in s][-1] == 2
    records = [json.loads(line) for line in (exp / "validation_log" / "2.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in records} == {"home_4", "home_5"}
    assert {r["data_source"] for r in records} == {"climate", "lights"}  # from the plug-in's task store
    assert all(len(r["tags"]) == 2 for r in records)
    assert json.loads((exp / "plugins.json").read_text())[0]["module"] == "home_env"
