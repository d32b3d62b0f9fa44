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
    fc_step_to_calls,
    method_parameters,
    parse_call,
    read_bfcl_scores,
)

mtc = pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
tasks_mod = pytest.importorskip("env_service.bfcl.tasks")
checker_mod = pytest.importorskip("env_service.bfcl.checker")

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


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


def _rebuild(name: str, args: list, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _positional(call: str) -> str:
    """The call with its keyword arguments passed by position where the signature allows."""
    name, kwargs = call_to_keywords(call)
    params = method_parameters().get(name, [])
    if list(kwargs) != params[: len(kwargs)]:
        return call
    return _rebuild(name, list(kwargs.values()), {})


def _perturb(gt: list[list[str]], kind: str, rng: random.Random) -> list[list[list[str]]]:
    turns = [[list(t)] if t else [] for t in gt]
    nonempty = [i for i, t in enumerate(gt) if t]
    k = rng.choice(nonempty)
    calls = turns[k][0]
    if kind == "drop":
        calls.pop(rng.randrange(len(calls)))
    elif kind == "dup":
        calls.append(rng.choice(calls))
    elif kind == "swap" and len(calls) > 1:
        i, j = rng.sample(range(len(calls)), 2)
        calls[i], calls[j] = calls[j], calls[i]
    elif kind == "clear":
        turns[k] = []
    elif kind == "strarg":
        for idx, c in enumerate(calls):
            name, kwargs = call_to_keywords(c)
            key = next((a for a, v in kwargs.items() if isinstance(v, str)), None)
            if key:
                calls[idx] = _rebuild(name, [], {**kwargs, key: kwargs[key] + "_x"})
                break
    elif kind == "shift" and k + 1 < len(turns):
        moved = calls.pop()
        turns[k + 1] = [[moved]] + turns[k + 1]
    elif kind == "positional":
        turns = [[[_positional(c) for c in step] for step in turn] for turn in turns]
    elif kind == "split" and len(calls) > 1:
        turns[k] = [calls[:1], calls[1:]]
    elif kind == "truncate":
        turns = turns[:-1]
    return [[s for s in turn if s] for turn in turns]


PERTURBATIONS = ("oracle", "drop", "dup", "swap", "clear", "strarg", "shift", "positional", "split", "truncate")


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
    rng = random.Random(hash(category) % 1000)
    ids = rng.sample(store.ids(category), len(PERTURBATIONS))
    records, expected = [], {}
    for n, tid in enumerate(ids):
        task = store.get(tid)
        kind = PERTURBATIONS[n % len(PERTURBATIONS)] if n else "oracle"
        turns = _perturb(task.gt_turns, kind, rng) if kind != "oracle" else _perturb(task.gt_turns, "none", rng)
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
