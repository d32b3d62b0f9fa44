"""The held-out test split of ``notes``: 110 generated tasks (``tasks_test.jsonl``) beside the 100
hand-written ones, which stay exactly as they were; every task passes with its ground truth and
fails when one of its calls is dropped or one string argument changed; the generator writes the
committed file byte for byte, under any hash seed."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from env_service.kit import ground_truth_replies
from env_service.notes import generate
from env_service.notes.episode import GENERATED_TASKS_FILE, TASKS_FILE, NotesEpisode, NotesTask, default_store
from seal_shared.calls import call_to_string, parse_call
from seal_shared.held_out import final_evaluation

ROOT = Path(__file__).resolve().parents[2]
STORE = default_store()
GENERATED = [STORE.get(i) for i in STORE.ids() if int(i.removeprefix("notes_")) >= 100]
ID_ARGS = {"note": "note_id", "item": "item_id", "event": "event_id"}


def play(task: NotesTask, replies: list[str]) -> dict:
    """The checker's verdict on ``replies`` played through an episode of ``task`` (validate mode)."""
    episode = NotesEpisode(task, {"rollout_mode": "validate"})
    episode.reset()
    for reply in replies:
        if episode.step(reply).terminated:
            break
    return episode.evaluate(sparse=False)


def perturbed(task: NotesTask) -> Iterator[tuple[str, NotesTask]]:
    """``task`` with the last call of one turn dropped, or with one string argument changed."""
    for k, calls in enumerate(task.gt_turns):
        if calls:
            turns = [list(c) for c in task.gt_turns]
            turns[k] = turns[k][:-1]
            yield f"turn {k}: {calls[-1]} dropped", dataclasses.replace(task, gt_turns=turns)
        for j, call in enumerate(calls):
            parsed = parse_call(call)
            for key, value in parsed.kwargs.items():
                if isinstance(value, str):
                    turns = [list(c) for c in task.gt_turns]
                    turns[k][j] = call_to_string(parsed.name, {**parsed.kwargs, key: value + "!"})
                    yield f"turn {k}: {call} with {key}={value + '!'!r}", dataclasses.replace(task, gt_turns=turns)


def test_at_least_100_generated_test_tasks_in_the_val_splits_category_shares() -> None:
    assert len(GENERATED) == 110 and len(STORE) == 210
    assert [t.id for t in GENERATED] == [f"notes_{i:03d}" for i in range(100, 210)]
    assert {t.split for t in GENERATED} == {"test"}
    with final_evaluation("the test split's size"):
        test = STORE.load_split("test")
    assert len(test) == 120 and set(test) >= {t.id for t in GENERATED}
    shares = Counter(t.category for t in GENERATED)
    val = Counter(STORE.get(i).category for i in STORE.load_split("val"))  # 14 / 10 / 6
    for category, n in val.items():
        assert abs(shares[category] / len(GENERATED) - n / 30) < 0.02, (category, shares)
    for task in GENERATED:
        assert 2 <= len(task.user_turns) <= 3 and set(task.classes) <= {"NotesApp", "TodoList", "Calendar"}
        # abstain: a turn whose right move is no call; the other categories call on every turn
        assert any(not calls for calls in task.gt_turns) == (task.category == "abstain"), task.id
        used = {_app_of(call) for calls in task.gt_turns for call in calls}
        assert used and used <= set(task.classes), task.id
        if task.category != "abstain":
            assert (len(used) >= 2) == (task.category == "cross_app") and used == set(task.classes), task.id


def _app_of(call: str) -> str:
    name = parse_call(call).name
    return next(app for app, words in (("NotesApp", "note"), ("TodoList", "item"), ("Calendar", "event"))
                if words in name)


def test_the_hand_written_tasks_are_unchanged_and_ids_unique() -> None:
    records = [json.loads(line) for line in TASKS_FILE.read_text().splitlines() if line.strip()]
    assert [r["id"] for r in records] == [f"notes_{i:03d}" for i in range(100)]
    assert Counter(r["split"] for r in records) == {"train": 60, "val": 30, "test": 10}
    ids = STORE.ids()
    assert len(ids) == len(set(ids)) == 210
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no committed tasks.jsonl to compare with")
    committed = subprocess.run([git, "show", "HEAD:env_service/notes/tasks.jsonl"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout
    assert TASKS_FILE.read_text() == committed
    for record in records:
        task = STORE.get(record["id"])
        assert (task.split, task.category, [list(t) for t in task.gt_turns]) == (
            record["split"], record["category"], [t["gt"] for t in record["turns"]])


@pytest.mark.parametrize("task_id", STORE.ids())
def test_every_task_passes_its_ground_truth_and_fails_perturbed(task_id: str) -> None:
    task = STORE.get(task_id)
    result = play(task, ground_truth_replies(task))
    assert result["valid"] and result["accuracy"] == 1.0, (task_id, result["error_type"])
    variants = list(perturbed(task))
    assert variants, task_id
    for what, wrong in variants:
        assert not play(task, ground_truth_replies(wrong))["valid"], f"{task_id}: passes with {what}"


def test_a_redundant_call_would_be_caught() -> None:
    """The perturbation check can fail: a turn that lists the same folder twice passes with one
    listing dropped, and the generator would not keep such a task."""
    record = json.loads(TASKS_FILE.read_text().splitlines()[2])  # notes_002: list_notes(folder='home'), ...
    record["turns"][0]["gt"] *= 2
    doubled = NotesTask.from_record(record)
    dropped = dict(perturbed(doubled))[f"turn 0: {record['turns'][0]['gt'][-1]} dropped"]
    assert play(doubled, ground_truth_replies(doubled))["valid"]
    assert play(doubled, ground_truth_replies(dropped))["valid"]
    assert not generate.sound(record) and generate.sound(json.loads(TASKS_FILE.read_text().splitlines()[2]))


def test_referred_ids_are_the_ids_called() -> None:
    """A user turn that names "note 3" (or an item or an event) acts on that id in that turn."""
    for task in GENERATED:
        for user, calls in zip(task.user_turns, task.gt_turns):
            for noun, number in re.findall(r"\b(note|item|event) (\d+)\b", user):
                assert any(f"{ID_ARGS[noun]}={number}" in call for call in calls), (task.id, user, calls)


def test_the_generator_writes_the_committed_file_under_any_hash_seed() -> None:
    records = generate.generate()
    assert generate.render(records) == GENERATED_TASKS_FILE.read_text(encoding="utf-8")
    assert generate.render(generate.generate()) == generate.render(records)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-m", "env_service.notes.generate", "--check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "is up to date: 110 tasks" in done.stdout, done.stderr


def test_check_fails_on_a_changed_file(tmp_path: Path) -> None:
    changed = tmp_path / "tasks_test.jsonl"
    changed.write_text(GENERATED_TASKS_FILE.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert generate.main(["--check", "--out", str(changed)]) == 1
    assert generate.main(["--write", "--out", str(changed)]) == 0
    assert changed.read_bytes() == GENERATED_TASKS_FILE.read_bytes()
