"""The ``notes`` example environment: its tasks, its checker, and its episodes through the service
(in-process for every task, over real HTTP via ``python -m env_service --env notes``)."""

from __future__ import annotations

import json

import pytest

from env_service.client import EnvClient, EnvServiceError
from env_service.notes.checker import World, check_episode
from env_service.notes.episode import NotesEpisode, default_store, load_split
from env_service.registry import get_environment, known_environments
from seal_shared.held_out import final_evaluation
from seal_shared.types import FailureTag

from live_service import running_service

STORE = default_store()
CATEGORIES = {"single_app", "cross_app", "abstain"}


def play(client: EnvClient, task_id: str, messages: list[str], **params) -> dict:
    created = client.create(task_id, {"rollout_mode": "validate", **params})
    try:
        for text in messages:
            if client.step(created.instance_id, text).terminated:
                break
        return client.evaluate(created.instance_id)
    finally:
        client.release(created.instance_id)


def oracle(task_id: str) -> list[str]:
    return NotesEpisode.oracle(STORE.get(task_id))


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_registered_by_name_with_its_tasks_and_splits() -> None:
    assert {"bfcl", "notes"} <= set(known_environments())
    env = get_environment("notes")
    assert len(STORE) == 210  # 100 hand-written, 110 generated test tasks (tasks_test.jsonl)
    train, val = load_split("train"), load_split("val")
    with final_evaluation("the split sizes"):
        test, held_out = load_split("test"), load_split("eval")
    assert len(train) == 60 and len(val) == 30 and len(test) == 120
    assert not set(train) & set(val) and not set(val) & set(test) and not set(train) & set(test)
    assert held_out == sorted(val + test)  # both held-out splits, in the store's (id) order
    # Categories come from the task record, not from the id's spelling.
    with EnvClient.in_process(env="notes") as client:
        categories = client.catalogue().categories
    assert set(categories.values()) == CATEGORIES and categories["notes_016"] == "abstain"
    assert len(categories) == len(env.task_store()) == 210
    for task_id in STORE.ids():
        task = STORE.get(task_id)
        assert len(task.gt_turns) >= 2 and all(doc["description"] for doc in task.tools)
        # An abstain task has a turn whose right move is no call; the other categories call on every turn.
        assert any(not calls for calls in task.gt_turns) == (task.category == "abstain"), task_id
    with pytest.raises(ValueError, match="unknown split"):
        load_split("dev")


def test_every_task_passes_its_own_ground_truth_in_process() -> None:
    with EnvClient.in_process(env="notes") as client:
        for task_id in STORE.ids():
            result = play(client, task_id, oracle(task_id))
            assert result["valid"] and result["accuracy"] == 1.0, (task_id, result["error_type"])
            assert result["category"] == STORE.get(task_id).category
            gt = STORE.get(task_id).gt_turns
            assert result["failure_tags"] == ["pass" if calls else "correct_abstention" for calls in gt]


def test_wrong_episodes_score_below_one_with_the_projects_tags() -> None:
    with EnvClient.in_process(env="notes") as client:
        silent = play(client, "notes_000", ["Sure.", "Sure."])
        assert silent["accuracy"] == 0.0
        assert silent["error_type"] == "multi_turn:empty_turn_model_response"
        assert silent["failure_tags"] == [FailureTag.EMPTY_TURN_MODEL_RESPONSE] * 2
        # Right first turn, then the wrong note moved: the state check fails on turn 1.
        wrong_id = [call("create_note", title="Packing list", body="passport, charger"), "Done.",
                    call("move_note", note_id=1, folder="travel"), "Done."]
        result = play(client, "notes_000", wrong_id)
        assert result["accuracy"] == 0.0 and result["failed_turn"] == 1
        assert result["error_type"] == "multi_turn:instance_state_mismatch"
        assert result["failure_tags"] == ["pass", "state_mismatch"]
        assert result["passed_turns"] == 1 and result["scorable_turns"] == 2
        # A mutating call on the turn where the right move is none.
        spurious = oracle("notes_016")[:2] + [call("delete_note", note_id=1), "Bye."]
        result = play(client, "notes_016", spurious)
        assert result["accuracy"] == 0.0 and result["failure_tags"] == ["pass", "spurious_tool_call"]


def test_protocol_rejects_bad_messages_and_unknown_tools() -> None:
    episode = NotesEpisode(STORE.get("notes_003"), {"rollout_mode": "validate"})
    system, user = episode.reset()
    assert "add_item" in system["content"] and "create_note" not in system["content"]
    assert user["content"].startswith("Add 'Book flights'")
    out = episode.step('<tool_call>{"name": "add_item", "arguments": </tool_call>')
    assert out.observation.startswith("[ERROR] Invalid tool call format") and not episode.model_turns[0]
    out = episode.step(call("create_note", title="x", body="y"))
    assert "not available" in out.observation
    out = episode.step(call("complete_item", item_id="2"))  # a string where an int belongs
    assert "argument 'item_id' must be int" in out.observation
    out = episode.step(call("add_item", text="Book flights", due="2025-07-01"))
    assert json.loads(out.observation.split("\n")[1]) == {"item_id": 4}
    with pytest.raises(ValueError):
        NotesEpisode(STORE.get("notes_003"), {"tool_prompt_mode": "bfcl_qwen_fc"})  # not a notes param


def test_calls_are_parsed_never_evaluated() -> None:
    world = World(["NotesApp"], {"NotesApp": {"notes": []}})
    assert world.run("__import__('os').system('true')").error == "parse"
    assert world.run("create_note(title=open('/etc/passwd').read(), body='')").error == "parse"
    assert world.run("state()").error == "unknown"
    assert world.state() == {"NotesApp": {"notes": {}}}


def test_checker_counts_force_terminated_and_missing_results() -> None:
    task = STORE.get("notes_002")  # turn 0 is the read-only list_notes(folder='home')
    short = check_episode([[["list_notes(folder='home')"]]], task)
    assert short["error_type"] == "multi_turn:force_terminated" and short["terminated_early"]
    no_read = check_episode([[["list_notes(folder='inbox')"]], [["delete_note(note_id=3)"]]], task)
    assert no_read["error_type"] == "multi_turn:execution_response_mismatch"
    assert no_read["failure_tags"] == ["response_mismatch", "pass"]


def test_interface_evolution_applies_to_training_episodes_only() -> None:
    lite = {"observation_lite": {"enable": True}}
    train = NotesEpisode(STORE.get("notes_000"), {"rollout_mode": "sample", **lite}).reset()[0]["content"]
    val = NotesEpisode(STORE.get("notes_000"), {"rollout_mode": "validate", **lite}).reset()[0]["content"]
    assert "[required]" in train and "[required]" not in val


def test_served_over_http_by_name() -> None:
    with running_service("--env", "notes", workers=1) as (url, _), EnvClient(url) as client:
        assert client.get_env_profile("val") == load_split("val")
        for task_id in ("notes_000", "notes_016", "notes_025"):
            assert play(client, task_id, oracle(task_id))["accuracy"] == 1.0
        wrong = play(client, "notes_000", ["No.", "No."])
        assert wrong["accuracy"] < 1.0 and wrong["failure_tags"] == ["empty_turn_model_response"] * 2
        with pytest.raises(EnvServiceError, match="unknown notes task id"):
            client.create("multi_turn_base_0")
        import httpx

        # The release's body names the environment on /create: the served one is accepted, another refused.
        ok = httpx.post(f"{url}/create", json={"env_type": "notes", "task_id": "notes_001"})
        assert ok.status_code == 200 and ok.json()["data"]["info"]["category"] == "single_app"
        refused = httpx.post(f"{url}/create", json={"env_type": "bfcl", "task_id": "notes_001"})
        assert refused.status_code == 400 and "this service serves 'notes'" in refused.json()["detail"]


def test_cli_help_documents_the_environment_flag() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "env_service", "--help"], capture_output=True, text=True, check=True)
    help_text = " ".join(out.stdout.split())
    assert "--env NAME" in help_text and "the environment to serve, by name: bfcl, notes or one a --plugin" in help_text
    bad = subprocess.run([sys.executable, "-m", "env_service", "--env", "webshop"], capture_output=True, text=True)
    line = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert line.startswith("python -m env_service: unknown environment 'webshop'") and "--plugin" in line
