"""Validation-log writer/reader: round trip, truncation, resume keys, partial lines."""

from __future__ import annotations

import json
import threading

import pytest

from seal.eval.logs import (
    ValidationLogWriter,
    ValidationRecord,
    finished_keys,
    is_pass,
    read_log_dir,
    read_log_file,
    record_score,
    step_of_file,
    truncate_messages,
)


def _record(task_id: str, score: float, step: int = 3, **kw) -> ValidationRecord:
    return ValidationRecord(
        task_id=task_id, data_source=task_id.rsplit("_", 1)[0], split="val", step=step,
        score=score, reward=score, valid=score >= 1, tags=["pass"] if score else ["state_mismatch"],
        messages=[{"role": "system", "content": "SYS"}, {"role": "user", "content": "do it"},
                  {"role": "assistant", "content": "ok"}, {"role": "user", "content": "obs"}],
        **kw,
    )


def test_round_trip_has_contract_and_release_keys(tmp_path):
    w = ValidationLogWriter(tmp_path / "validation_log")
    w.write(_record("multi_turn_base_4", 1.0, num_llm_calls=2))
    w.write(_record("multi_turn_miss_func_9", 0.0))
    steps = read_log_dir(tmp_path / "validation_log")
    assert list(steps) == [3]
    first, second = steps[3]
    contract = {"task_id", "data_source", "split", "score", "reward", "step", "valid", "error_type",
                "tags", "num_llm_calls", "num_prompt_tokens", "num_response_tokens",
                "terminated_reason", "messages", "generation"}
    release = {"input", "output", "score", "step", "reward", "task_id", "data_source"}
    assert contract | release <= set(first)
    assert first["num_llm_calls"] == 2 and first["input"] == "SYS\ndo it"
    assert "[assistant] ok" in first["output"] and "[user] obs" in first["output"]
    assert second["data_source"] == "multi_turn_miss_func" and not is_pass(second) and is_pass(first)


def test_truncation_keeps_head_and_tail():
    msgs = [{"role": "user", "content": "A" * 50 + "B" * 50}]
    out = truncate_messages(msgs, 20)
    assert out[0]["content"].startswith("A" * 10) and out[0]["content"].endswith("B" * 10)
    assert "80 characters truncated" in out[0]["content"]
    assert msgs[0]["content"] == "A" * 50 + "B" * 50  # input untouched
    assert truncate_messages(msgs, None) == msgs
    with pytest.raises(ValueError, match="max_message_chars"):
        truncate_messages(msgs, 5)


def test_partial_trailing_line_is_skipped_then_repaired(tmp_path):
    w = ValidationLogWriter(tmp_path)
    w.write(_record("multi_turn_base_4", 1.0))
    with w.path_for(3).open("a") as fh:
        fh.write('{"task_id": "multi_turn_base_9", "sco')  # a crash mid-line
    assert [r["task_id"] for r in read_log_file(w.path_for(3))] == ["multi_turn_base_4"]
    w.write(_record("multi_turn_base_21", 0.0))
    assert [r["task_id"] for r in read_log_file(w.path_for(3))] == ["multi_turn_base_4", "multi_turn_base_21"]


def test_finished_keys_ignore_errored_records(tmp_path):
    w = ValidationLogWriter(tmp_path)
    w.write(_record("multi_turn_base_4", 1.0))
    w.write(_record("multi_turn_base_9", 0.0, error="EnvUnavailableError: down"))
    w.write(_record("multi_turn_base_9", 0.0, repeat=1))
    assert finished_keys(w.path_for(3)) == {("multi_turn_base_4", 0), ("multi_turn_base_9", 1)}
    assert finished_keys(tmp_path / "missing.jsonl") == set()


def test_concurrent_writers_produce_whole_lines(tmp_path):
    w = ValidationLogWriter(tmp_path, max_message_chars=64)
    threads = [threading.Thread(target=lambda i=i: [w.write(_record(f"multi_turn_base_{i * 10 + j}", 1.0))
                                                    for j in range(10)]) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = w.path_for(3).read_text().splitlines()
    assert len(lines) == 40 and all(json.loads(line)["score"] == 1.0 for line in lines)


def test_score_fallback_and_step_names():
    assert record_score({"reward": 1}) == 1.0
    assert record_score({"score": 0.0, "reward": 1.0}) == 0.0
    with pytest.raises(KeyError, match="neither"):
        record_score({"task_id": "x"})
    assert step_of_file("12.jsonl") == 12 and step_of_file("traj_12.jsonl") is None
