"""The ``notes`` example environment plugged into the trainer side: picked by ``env_service.env``,
its params block, its splits and categories, the launcher's ``--with-env``, and two training steps
of ``launcher.py --conf exp/examples/notes.yaml`` on CPU with SmolLM2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import launcher
from env_service.client import EnvClient
from seal.config import ConfigError, compose_config
from seal.environment import env_params_block, environment_name, episode_params, make_env_client, task_categories
from seal.trainer.coevolution import CoEvolution
from seal.trainer.tasks import select_task_ids
from seal.trainer.verl.dataset import TaskDataset

CONF = str(launcher.REPO_ROOT / "exp" / "examples" / "notes.yaml")


@pytest.fixture(scope="module")
def cfg():
    return compose_config(CONF)


def test_config_picks_the_environment_and_its_params_block(cfg, tmp_path) -> None:
    assert environment_name(cfg) == "notes"
    block = env_params_block(cfg)
    assert block["observation_lite"]["enable"] is True and "tool_prompt_mode" not in block
    params = episode_params(cfg, "sample", {"max_steps_per_turn": 3})
    assert params["rollout_mode"] == "sample" and params["max_steps_per_turn"] == 3
    hooks_params = CoEvolution(cfg, tmp_path).env_params(train=False, category="abstain")
    assert hooks_params == {**block, "rollout_mode": "validate"}
    # The BFCL configs keep their block under env_service.bfcl.
    bfcl = compose_config(str(launcher.REPO_ROOT / "exp" / "quickstart_bfcl.yaml"))
    assert environment_name(bfcl) == "bfcl" and env_params_block(bfcl)["tool_prompt_mode"] == "bfcl_qwen_fc"


def test_tasks_and_categories_come_from_the_environment(cfg) -> None:
    assert select_task_ids(cfg, "train") == ["notes_000", "notes_001"]
    assert select_task_ids(cfg, "val") == ["notes_020", "notes_021"]
    abstain = compose_config(CONF, ["seal.tasks.categories=[abstain]", "seal.tasks.max_train_tasks=null"])
    ids = select_task_ids(abstain, "train")
    assert ids == [f"notes_{i:03d}" for i in (*range(16, 20), *range(64, 70))]
    assert set(task_categories(abstain, ids).values()) == {"abstain"}
    rows = TaskDataset.from_config(abstain, "train")
    assert [rows[i]["data_source"] for i in range(len(rows))] == ["abstain"] * 10
    assert TaskDataset(["multi_turn_miss_func_3"], rollout_mode="sample")[0]["data_source"] == "multi_turn_miss_func"


def test_bad_environment_settings_fail_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="unknown environment .*known: bfcl, notes"):
        compose_config(CONF, ["env_service.env=webshop"])
    with pytest.raises(ConfigError, match="env_service.notes: max_steps_per_turn"):
        compose_config(CONF, ["env_service.notes.max_steps_per_turn=many"])
    with pytest.raises(ConfigError, match="task id 'multi_turn_base_0' does not exist .*notes tasks"):
        compose_config(CONF, ["seal.tasks.train_ids=[multi_turn_base_0]"])


def test_in_process_client_serves_the_configured_environment() -> None:
    client = make_env_client(compose_config(CONF, ["env_service.url=null"]))
    try:
        created = client.create("notes_019", {"rollout_mode": "validate"})
        assert created.info["category"] == "abstain" and "add_event" in created.messages[0]["content"]
    finally:
        client.close()


@pytest.mark.slow
def test_with_env_starts_the_configured_environment(tmp_path, monkeypatch) -> None:
    import seal.trainer.local as local

    monkeypatch.chdir(tmp_path)
    url = f"http://127.0.0.1:{launcher_free_port()}"
    seen = []

    def probe(cfg, *, exp_dir):
        with EnvClient(cfg.env_service.url) as client:
            seen.append(client.get_env_profile("val"))

    monkeypatch.setattr(local, "run_local", probe)
    assert launcher.main(["--conf", CONF, "--with-env", "--", f"env_service.url={url}"]) == 0
    assert seen == [[f"notes_{i:03d}" for i in (*range(20, 25), *range(70, 95))]]
    assert not launcher._healthy(url)


def launcher_free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_training_steps_on_cpu_through_the_launcher(tmp_path) -> None:
    overrides = ["seal.rollout.max_llm_calls=1", "seal.rollout.max_tokens_per_call=16", "trainer.val_before_train=false",
                 "seal.local.progress_bars=false", "seal.local.tensorboard=false", "trainer.save_freq=-1"]
    proc = subprocess.run([sys.executable, str(launcher.REPO_ROOT / "launcher.py"), "--conf", CONF, "--", *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exp = tmp_path / "experiments" / "notes_quickstart"
    steps = [json.loads(line) for line in (exp / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "step" in s][-1] == 2
    records = [json.loads(line) for line in (exp / "validation_log" / "2.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in records} == {"notes_020", "notes_021"}
    assert {r["data_source"] for r in records} == {"single_app"}  # from the task store, not the id
    assert all(len(r["tags"]) == 2 for r in records)
    state = json.loads((exp / "diagnostic_state" / "capability_state.json").read_text())
    assert {t: v["category"] for t, v in state["tasks"].items()} == {"notes_000": "single_app",
                                                                     "notes_001": "single_app"}
    assert (exp / "diagnostic_stats" / "epoch_0.json").is_file()
