"""A client that leaves ``rollout_mode`` out gets the evaluation interface: no training hints."""

from __future__ import annotations

import pytest

from env_service.bfcl.episode import BfclParams
from env_service.client import EnvClient
from seal_shared.interface import EpisodeInterface

TASK = "multi_turn_base_0"
HINTS_ON = {
    "observation_lite": {"enable": True},
    "tool_feedback_evolution": {"enable": True},
    "diagnostic_evolution": {"enable": True, "lines": ["[Cautious-call] Think before calling."]},
}


@pytest.fixture(scope="module")
def client():
    c = EnvClient.in_process(workers=0)
    yield c
    c.close()


def test_defaults_are_the_evaluation_interface():
    assert BfclParams().rollout_mode == "validate"
    assert EpisodeInterface.from_params({**HINTS_ON}, category="multi_turn_base").active == {
        "observation_lite": False, "tool_feedback_evolution": False, "diagnostic_evolution": False}
    assert EpisodeInterface(category="multi_turn_base").is_validation


def _episode_text(client, params: dict) -> tuple[str, str]:
    created = client.create(TASK, params)
    bad = client.step(created.instance_id, "<tool_call>{not json}</tool_call>")
    client.release(created.instance_id)
    return created.messages[0]["content"], bad.observation


def test_service_without_rollout_mode_shows_no_hints(client):
    system, observation = _episode_text(client, dict(HINTS_ON))
    assert "[required]" not in system and "Observation note" not in system and "[Cautious-call]" not in system
    assert "[Hint]" not in observation
    asked = {**HINTS_ON, "rollout_mode": "validate"}
    assert _episode_text(client, asked) == (system, observation)  # the same as asking for validation


def test_training_interface_only_when_asked(client):
    system, observation = _episode_text(client, {**HINTS_ON, "rollout_mode": "sample"})
    assert "[required]" in system and "[Cautious-call]" in system and "[Hint]" in observation
