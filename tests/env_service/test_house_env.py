"""``house`` (``tests/plugins/house_env.py``), the learning benchmark's second environment: its
generated tasks are stable, split 90/30, each passes with its ground truth and fails without it."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from env_service.client import EnvClient
from env_service.kit import ground_truth_replies
from env_service.registry import unregister_environment

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture
def house(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    sys.modules.pop("house_env", None)
    yield importlib.import_module("house_env")
    unregister_environment("house")
    sys.modules.pop("house_env", None)


def play(client: EnvClient, task_id: str, replies: list[str]) -> dict:
    created = client.create(task_id, {"rollout_mode": "validate"})
    try:
        for reply in replies:
            if client.step(created.instance_id, reply).terminated:
                break
        return client.evaluate(created.instance_id, sparse=False)
    finally:
        client.release(created.instance_id)


def test_the_tasks_are_generated_the_same_and_split_90_30(house: ModuleType) -> None:
    tasks = house.build_tasks()
    assert [t.gt_turns for t in tasks] == [t.gt_turns for t in house.build_tasks()]
    assert Counter(t.split for t in tasks) == {"train": 90, "val": 30}
    assert set(Counter(t.category for t in tasks)) == {"climate", "lights", "blinds", "multi", "query"}
    assert all(2 <= len(t.user_turns) <= 3 for t in tasks)


def test_every_task_passes_with_its_ground_truth_and_fails_without(house: ModuleType) -> None:
    with EnvClient.in_process(env="house") as client:
        ids = client.get_env_profile("train") + client.get_env_profile("val")
        assert len(ids) == 120
        for task in house.build_tasks():
            result = play(client, task.id, ground_truth_replies(task))
            assert result["valid"] is True, (task.id, result)
        silent = play(client, "house_000", ["Done."] * 3)
        assert silent["valid"] is False and silent["failure_tags"][0] == "empty_turn_model_response"


def test_a_query_task_needs_the_reading_and_the_right_arithmetic(house: ModuleType) -> None:
    """Setting the temperature it read (not read plus or minus the asked change) fails the turn."""
    task = next(t for t in house.build_tasks() if t.category == "query")
    room = next(r for r in house.ROOMS if f"room='{r}'" in task.gt_turns[0][0])
    unchanged = house.HouseTask(**{**task.__dict__, "gt_turns": [
        task.gt_turns[0], [f"set_temperature(room='{room}', degrees={task.rooms[room]['temperature']})"],
        *task.gt_turns[2:]]})
    with EnvClient.in_process(env="house") as client:
        good = play(client, task.id, ground_truth_replies(task))
        bad = play(client, task.id, ground_truth_replies(unchanged))
    assert good["valid"] is True
    assert bad["valid"] is False and bad["failure_tags"][1] == "state_mismatch", bad
