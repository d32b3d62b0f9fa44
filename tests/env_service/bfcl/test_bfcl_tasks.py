"""Task store and splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_service.bfcl import tasks as tasks_mod
from env_service.bfcl.tasks import CATEGORIES, PYTHON_NOTE, bfcl_data_dir, load_split, load_store
from seal_shared.held_out import final_evaluation


def _package_docs(cls: str) -> list[dict]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = bfcl_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[cls]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_store_holds_800_tasks_200_per_category():
    store = load_store()
    assert len(store) == 800
    for category in CATEGORIES:
        ids = store.ids(category=category)
        assert len(ids) == 200
        assert all(store.get(i).category == category for i in ids)


def test_composite_is_an_optional_extra(store):
    assert len(store.ids(category="multi_turn_composite")) == 200
    assert "multi_turn_composite_0" not in load_store()
    assert store.get("multi_turn_composite_0").long_context  # BFCL pads composite like long_context


def test_unknown_id_names_the_id(store):
    with pytest.raises(KeyError, match="multi_turn_base_999"):
        store.get("multi_turn_base_999")


def test_tools_are_built_as_bfcl_builds_them(store):
    task = store.get("multi_turn_base_0")
    expected = [d["name"] for cls in task.entry["involved_classes"] for d in _package_docs(cls)]
    assert [t["name"] for t in task.tools] == expected
    assert all(t["description"].endswith(PYTHON_NOTE) for t in task.tools)
    assert task.held_out == {}
    assert task.gt_turns[0][0] == "cd(folder='document')"
    assert not task.long_context and store.get("multi_turn_long_context_0").long_context


def test_miss_func_docs_are_held_out_until_their_turn(store):
    for tid in store.ids(category="multi_turn_miss_func"):
        task = store.get(tid)
        missed = task.entry["missed_function"]
        assert sorted(task.held_out) == sorted(int(k) for k in missed)
        for turn, docs in task.held_out.items():
            names = [d["name"] for d in docs]
            assert names == missed[str(turn)]
            assert not set(names) & {t["name"] for t in task.tools}
            # BFCL sets held-out docs aside before adding the note.
            assert not any(d["description"].endswith(PYTHON_NOTE) for d in docs)
            assert task.user_message(turn) is None


def test_store_entries_are_not_mutated_by_building_tools(store):
    task = store.get("multi_turn_miss_func_0")
    assert task.entry["missed_function"] == {"3": ["sort"]}
    assert "function" not in task.entry


def test_splits_match_the_parquet_files():
    with final_evaluation("the split sizes"):
        train, val, test, ev = (load_split(s) for s in ("train", "val", "test", "eval"))
    assert (len(train), len(val), len(test), len(ev)) == (400, 100, 300, 400)
    assert set(ev) == set(val) | set(test)
    assert not set(train) & set(ev)
    store = load_store()
    assert set(train) | set(ev) == set(store.ids())
    # The split is by scenario index: index k is in the same split in every category.
    idx = {tid.rsplit("_", 1)[1] for tid in val}
    assert len(idx) == 25


def test_old_split_file_is_not_the_eval_list():
    old = json.loads((Path(tasks_mod.data_dir()) / "bfcl_400_split.json").read_text())
    with final_evaluation("comparing the eval split with an older split file"):
        assert set(old["test"]) != set(load_split("eval"))


def test_data_dir_override_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("SEAL_DATA_DIR", str(tmp_path))
    assert tasks_mod.data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="SEAL_DATA_DIR"):
        load_split("train")
    with pytest.raises(ValueError, match="unknown split"):
        load_split("dev")
