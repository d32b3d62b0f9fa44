"""BFCL export round trip: exported FC result files, decoded the way BFCL decodes them and
scored by BFCL's own multi-turn checker, agree with this project's checker on oracle and
perturbed trajectories; and the export itself loses nothing (same BFCL verdict before/after)."""

from __future__ import annotations

import copy
import json
import random
import uuid

import pytest

from seal.eval.export import (
    call_to_fc,
    call_to_keywords,
    export_records,
    parse_call,
    read_bfcl_scores,
)
from seal.eval.roundtrip import PERTURBATIONS, compare, perturb, roundtrip_records

mtc = pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
tasks_mod = pytest.importorskip("env_service.bfcl.tasks")
checker_mod = pytest.importorskip("env_service.bfcl.checker")

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


def fc_step_to_calls(step: list[dict[str, str]]) -> list[str]:
    """What BFCL's FC decoder makes of one step: ``name(k=repr(v),...)`` per tool call."""
    calls = []
    for fc in step:
        for name, args in fc.items():
            values = json.loads(args) if isinstance(args, str) else args
            calls.append(f"{name}({','.join(f'{k}={v!r}' for k, v in values.items())})")
    return calls


def _bfcl_verdict(result_turns: list, gt: list[list[str]], entry: dict) -> tuple[bool, str | None]:
    """BFCL's eval_runner on one FC result line: length check, FC decode, multi_turn_checker."""
    if len(result_turns) != len(gt):
        return False, "multi_turn:force_terminated"
    decoded = [[fc_step_to_calls(step) for step in turn if fc_step_to_calls(step)] for turn in result_turns]
    name = "m" + uuid.uuid4().hex  # a fresh instance-cache key per check: BFCL caches in globals()
    out = mtc.multi_turn_checker(decoded, gt, copy.deepcopy(entry), entry["id"].rsplit("_", 1)[0], name)
    return bool(out["valid"]), (None if out["valid"] else out["error_type"])


def _raw_verdict(model_turns: list, gt: list[list[str]], entry: dict) -> tuple[bool, str | None]:
    if len(model_turns) != len(gt):
        return False, "multi_turn:force_terminated"
    name = "m" + uuid.uuid4().hex
    out = mtc.multi_turn_checker(model_turns, gt, copy.deepcopy(entry), entry["id"].rsplit("_", 1)[0], name)
    return bool(out["valid"]), (None if out["valid"] else out["error_type"])


@pytest.fixture(scope="module")
def store():
    return tasks_mod.default_store()


def test_call_conversion_names_positional_arguments():
    assert call_to_fc("sort('final_report.pdf')") == {"sort": json.dumps({"file_name": "final_report.pdf"})}
    assert fc_step_to_calls([call_to_fc("mv(source='a', destination='b')")]) == ["mv(source='a',destination='b')"]
    assert parse_call("cd(folder='..')") == ("cd", [], {"folder": ".."})
    with pytest.raises(ValueError, match="non-literal"):
        parse_call("cd(folder=__import__('os').getcwd())")
    with pytest.raises(ValueError, match="both by position and keyword"):
        call_to_keywords("cd('a', folder='b')")


@pytest.mark.parametrize("category", CATEGORIES)
def test_export_agrees_with_bfcl_checker_and_ours(tmp_path, store, category):
    rng = random.Random(sum(map(ord, category)))
    ids = rng.sample(store.ids(category=category), len(PERTURBATIONS))
    records, expected = [], {}
    for n, tid in enumerate(ids):
        task = store.get(tid)
        kind = PERTURBATIONS[n]
        turns = perturb(task.gt_turns, kind, rng)
        ours = checker_mod.check_episode(turns, task.gt_turns, task.entry)
        raw = _raw_verdict(turns, task.gt_turns, task.entry)
        assert (ours.valid, ours.error_type) == raw, (tid, kind)
        expected[tid] = raw
        records.append({"task_id": tid, "data_source": category, "score": float(ours.valid),
                        "model_turns": turns})
    paths = export_records(records, tmp_path)
    assert list(paths) == [category]
    lines = [json.loads(x) for x in paths[category].read_text().splitlines()]
    assert sorted(line["id"] for line in lines) == sorted(ids)
    for line in lines:
        task = store.get(line["id"])
        assert _bfcl_verdict(line["result"], task.gt_turns, task.entry) == expected[line["id"]], line["id"]
    assert any(v[0] for v in expected.values()) and not all(v[0] for v in expected.values())


def test_roundtrip_records_and_compare(store):
    recs = [r.to_json_dict() for r in roundtrip_records(per_category=2, seed=1)]
    assert len(recs) == 8 and {r["extra"]["perturbation"] for r in recs} == {"oracle", "drop"}
    assert all(r["valid"] for r in recs if r["extra"]["perturbation"] == "oracle")
    official = {r["task_id"]: (r["valid"], r["error_type"]) for r in recs}
    assert compare(recs, official) == []
    flipped = dict(official, **{recs[0]["task_id"]: (not recs[0]["valid"], "multi_turn:x")})
    assert len(compare(recs, flipped)) == 1
    assert compare(recs, {}) and "not scored" in compare(recs, {})[0]


def test_read_bfcl_scores(tmp_path):
    score = tmp_path / "score" / "gpt-4o-2024-11-20-FC" / "multi_turn"
    score.mkdir(parents=True)
    (score / "BFCL_v4_multi_turn_base_score.json").write_text(
        json.dumps({"accuracy": 0.5, "correct_count": 1, "total_count": 2}) + "\n"
        + json.dumps({"id": "multi_turn_base_4", "valid": False,
                      "error": {"error_type": "multi_turn:instance_state_mismatch"}}) + "\n")
    got = read_bfcl_scores(tmp_path, ["multi_turn_base_4", "multi_turn_base_9"])
    assert got == {"multi_turn_base_4": (False, "multi_turn:instance_state_mismatch"),
                   "multi_turn_base_9": (True, None)}


def test_export_rejects_records_without_turns(tmp_path):
    with pytest.raises(ValueError, match="no model_turns"):
        export_records([{"task_id": "multi_turn_base_4", "data_source": "multi_turn_base", "score": 1.0}], tmp_path)
    with pytest.raises(ValueError, match="FC model"):
        export_records([], tmp_path, model="gpt-4o-2024-11-20")
