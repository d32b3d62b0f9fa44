"""The service driven exactly as the SEAL release's own client drives it.

The release's ``EnvClient`` (AgentEvolver ``agentevolver/client/env_client.py``) uses a ``requests``
session and, for every call, posts ``{"env_type", "task_id", "instance_id", "messages", "params"}`` to
``base_url + "/" + endpoint``. Facts this test reproduces (the code here is written for the test):

* ``env_type`` is the task's (``"bfcl"``) on ``/create`` and on the profile request, and the default
  ``"default"`` on ``/step``, ``/evaluate``, ``/get_info`` and ``/release``;
* the profile request's endpoint is ``"/get_env_profile"``, so the path is ``//get_env_profile``;
* its trainer reads ``data.state`` (two messages, the last a ``user`` one) and
  ``data.info.instance_id`` from ``/create``; ``data.state`` (one message: ``role``, ``content``,
  ``tool_calls``), ``data.is_terminated`` and ``data.reward`` from ``/step``; ``data`` (a number,
  ``>= 1`` meaning success) from ``/evaluate`` with ``params={"sparse": true}``; ``data`` from
  ``/get_info`` and ``/get_env_profile``; and ``success`` from ``/release``.

Before the service looked instances up by id alone, every ``/step`` of this client got 400
(``unknown env_type 'default'``) and its profile request 404.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import requests

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.tasks import default_store
from live_service import running_service


class ReleaseStyleClient:
    """The release client's wire behaviour: same paths, same bodies, same fields read."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()

    def _post(self, endpoint: str, env_type: str = "default", task_id: str | None = None,
              instance_id: str | None = None, messages: dict | None = None, params: dict | None = None) -> dict:
        body = {"env_type": env_type, "task_id": task_id, "instance_id": instance_id,
                "messages": messages or {}, "params": params or {}}
        response = self.session.post(f"{self.base_url}/{endpoint}", json=body, timeout=60)
        response.raise_for_status()
        return response.json()

    def get_env_profile(self, env_type: str, split: str = "train") -> list[str]:
        return self._post("/get_env_profile", env_type=env_type, params={"split": split})["data"]

    def create_instance(self, env_type: str, task_id: str, instance_id: str, params: dict) -> dict:
        return self._post("create", env_type=env_type, task_id=task_id, instance_id=instance_id,
                          params=params)["data"]

    def step(self, instance_id: str, action: dict) -> dict:
        return self._post("step", instance_id=instance_id, messages=action)["data"]

    def evaluate(self, instance_id: str, params: dict) -> float:
        return self._post("evaluate", instance_id=instance_id, params=params)["data"]

    def get_tools_info(self, instance_id: str) -> dict:
        return self._post("get_info", instance_id=instance_id)["data"]

    def release_instance(self, instance_id: str) -> bool:
        return self._post("release", instance_id=instance_id)["success"]


@pytest.fixture(scope="module")
def client() -> Iterator[ReleaseStyleClient]:
    with running_service(workers=1) as (url, _):
        yield ReleaseStyleClient(url)


def _episode(client: ReleaseStyleClient, task_id: str, replies: list[str]) -> tuple[float, list[dict]]:
    """The release's env worker and agent flow: create, step until terminated, evaluate, release."""
    instance_id = uuid.uuid4().hex
    init = client.create_instance("bfcl", task_id, instance_id,
                                  {"is_open_query": False, "rollout_mode": "sample"})
    state = init["state"]
    assert isinstance(state, list) and len(state) == 2 and state[-1]["role"] == "user" and state[-1]["content"]
    assert init["info"]["instance_id"] == instance_id
    observations = []
    for reply in replies:
        out = client.step(instance_id, {"content": reply, "role": "assistant"})
        assert len(out["state"]) == 1
        message = out["state"][0]
        assert message["role"] in ("user", "tool") and isinstance(message["content"], str)
        assert message.pop("tool_calls", None) == []
        assert isinstance(out["reward"], float)
        observations.append(message)
        if out["is_terminated"]:
            break
    assert out["is_terminated"] is True
    info = client.get_tools_info(instance_id)
    assert info["task_id"] == task_id and info["terminated"] is True
    score = client.evaluate(instance_id, {"sparse": True})
    assert isinstance(score, float) and score == out["reward"]
    assert client.release_instance(instance_id) is True
    return score, observations


def test_profile_through_the_double_slash(client: ReleaseStyleClient) -> None:
    train = client.get_env_profile("bfcl", "train")
    assert len(train) == 400 and all(t.startswith("multi_turn_") for t in train)
    assert len(client.get_env_profile("bfcl", "val")) == 100


@pytest.mark.parametrize("task_id", ["multi_turn_base_0", "multi_turn_miss_func_3", "multi_turn_long_context_2"])
def test_oracle_episode_scores_one(client: ReleaseStyleClient, task_id: str) -> None:
    score, _ = _episode(client, task_id, BfclEpisode.oracle(default_store().get(task_id)))
    assert score == 1.0


def test_wrong_episode_scores_below_one(client: ReleaseStyleClient) -> None:
    task = default_store().get("multi_turn_base_0")
    wrong = '<tool_call>\n{"name": "mkdir", "arguments": {"dir_name": "not_asked_for"}}\n</tool_call>'
    score, observations = _episode(client, task.id, [wrong] + ["Done."] * len(task.gt_turns))
    assert score < 1.0 and score == 0.0
    assert "<tool_response>" in observations[0]["content"]


def test_release_of_a_released_instance_reports_false(client: ReleaseStyleClient) -> None:
    instance_id = uuid.uuid4().hex
    client.create_instance("bfcl", "multi_turn_base_1", instance_id, {})
    assert client.release_instance(instance_id) is True
    assert client.release_instance(instance_id) is False
    with pytest.raises(requests.HTTPError) as err:
        client.step(instance_id, {"content": "hi", "role": "assistant"})
    assert err.value.response.status_code == 404
    assert "was released" in json.loads(err.value.response.text)["detail"]


def test_create_still_checks_env_type(client: ReleaseStyleClient) -> None:
    with pytest.raises(requests.HTTPError) as err:
        client.create_instance("webshop", "multi_turn_base_0", uuid.uuid4().hex, {})
    assert err.value.response.status_code == 400
    assert "env_type 'webshop'" in err.value.response.json()["detail"]
