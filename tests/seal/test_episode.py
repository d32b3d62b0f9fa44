"""The typed episode record: the one parse of the ``/evaluate`` wire result, its field form for
verl's ``extra_fields``/batch columns, and one ValidationRecord for every path that logs it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seal.episode import FIELD_NAMES, EpisodeResult, Evaluation, WireFormatError
from seal.eval.logs import ValidationRecord

TASK = "multi_turn_miss_func_7"


@pytest.fixture(scope="module")
def wire() -> dict:
    """A real ``/evaluate`` result (``sparse=false``): the in-process BFCL service after two turns."""
    from env_service.client import EnvClient

    client = EnvClient.in_process()
    try:
        created = client.create(TASK, {"rollout_mode": "validate"})
        client.step(created.instance_id, "I am not sure what to do.")
        client.step(created.instance_id, '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>')
        result = client.evaluate(created.instance_id, False)
        client.release(created.instance_id)
    finally:
        client.close()
    return json.loads(json.dumps(result))


def test_every_wire_field_is_parsed(wire: dict) -> None:
    ev = Evaluation.from_wire(wire)
    assert ev.valid is wire["valid"] is False and ev.error_type == wire["error_type"] is not None
    assert list(ev.tags) == wire["failure_tags"] and len(ev.tags) == len(wire["per_turn_valid"])
    assert ev.model_turns == wire["model_turns"] and ev.category == wire["category"] == "multi_turn_miss_func"
    assert ev.terminated_reason == wire["terminated_reason"]
    assert list(ev.per_turn_valid) == wire["per_turn_valid"]
    for key in ("passed_turns", "scorable_turns", "irrelevance_turns", "passed_irrelevance_turns", "failed_turn",
                "progress", "progress_with_irrelevance", "events"):
        assert getattr(ev, key) == wire[key], key
    assert ev.to_wire() == wire and Evaluation.from_wire(ev.to_wire()) == ev
    assert ev.log_extra()["env_terminated_reason"] == wire["terminated_reason"]


def test_optional_fields_are_none_when_not_reported() -> None:
    ev = Evaluation.from_wire({"valid": True, "failure_tags": ["pass"]})
    assert ev.valid and ev.tags == ("pass",) and ev.error_type is None and ev.model_turns is None
    assert ev.progress is None and ev.per_turn_valid is None and ev.log_extra() == {}


@pytest.mark.parametrize("missing", ["valid", "failure_tags"])
def test_a_missing_required_field_is_one_clear_error(wire: dict, missing: str) -> None:
    broken = {k: v for k, v in wire.items() if k != missing}
    with pytest.raises(WireFormatError, match=f"lacks \\['{missing}'\\]"):
        Evaluation.from_wire(broken)


@pytest.mark.parametrize("bad", [{"valid": "yes"}, {"failure_tags": "pass"}, {"progress": "most"}])
def test_a_wrongly_typed_field_is_named(wire: dict, bad: dict) -> None:
    (key,) = bad
    with pytest.raises(WireFormatError, match=key):
        Evaluation.from_wire({**wire, **bad})
    with pytest.raises(WireFormatError, match="JSON object"):
        Evaluation.from_wire(1.0)  # a sparse result is not a full evaluation


def _result(wire: dict, **changes) -> EpisodeResult:
    base = dict(task_id=TASK, category="multi_turn_miss_func", rollout_mode="validate",
                evaluation=Evaluation.from_wire(wire), reward=0.0, num_llm_calls=2, num_prompt_tokens=900,
                num_response_tokens=40, truncated_response_tokens=3, clipped_observations=1,
                terminated_reason="completed", messages=({"role": "system", "content": "S"},
                                                         {"role": "user", "content": "[ERROR] no such file"}))
    return EpisodeResult(**{**base, **changes})


def test_field_form_round_trips_through_json_and_verls_columns(wire: dict) -> None:
    results = [_result(wire), _result(wire, env_fault=True, evaluation=None, error="connection refused"),
               _result(wire, llm_fault=True, error="aborted")]
    for r in results:
        fields = r.to_fields()
        assert tuple(fields) == FIELD_NAMES
        assert EpisodeResult.from_fields(json.loads(json.dumps(fields))) == r
    # verl's agent-loop post-processing: one numpy object column per key, rows read back by index.
    columns = {}
    for name in FIELD_NAMES:
        col = np.empty(len(results), dtype=object)
        col[:] = [r.to_fields()[name] for r in results]
        columns[name] = col
    columns["excluded"] = np.array([r.excluded for r in results])  # numpy bools, as concat may leave them
    back = [EpisodeResult.from_fields({k: c[i] for k, c in columns.items()}) for i in range(len(results))]
    assert back == results


def test_missing_fields_are_named(wire: dict) -> None:
    fields = _result(wire).to_fields()
    del fields["reward"], fields["check"]
    with pytest.raises(WireFormatError, match=r"\['reward', 'check'\]"):
        EpisodeResult.from_fields(fields)


def test_derived_views(wire: dict) -> None:
    r = _result(wire, evaluation=Evaluation.from_wire({**wire, "valid": True}))
    assert r.valid and r.tags == tuple(wire["failure_tags"]) and r.error_messages == ["[ERROR] no such file"]
    faulted = _result(wire, env_fault=True, error="down")
    assert faulted.excluded and not faulted.valid and faulted.fault_text() == "environment fault: down"
    assert _result(wire, llm_fault=True, error="x").fault_text() == "LLM fault: x"
    assert _result(wire).fault_text() is None


def test_one_validation_record_for_the_local_and_verl_paths(wire: dict) -> None:
    """The local trainer's log (through its Episode) and the verl dump (through the JSON column)
    give the same line for the same record."""
    from seal.trainer.local.episodes import Episode
    from seal.trainer.local.validation import write_validation_log
    from seal.trainer.verl.validation import validation_records

    result = _result(wire).with_reward(0.0, {"mode": "binary"})
    generation = {"temperature": 0.0}
    (verl_line,) = validation_records([json.dumps(result.to_fields())], [0.0], step=4, generation=generation)
    direct = ValidationRecord.from_episode(result, step=4, split="val", generation=generation)
    assert verl_line == direct
    assert (direct.score, direct.valid, direct.data_source, direct.num_prompt_tokens) == (0.0, False,
                                                                                         result.category, 900)
    assert direct.tags == list(result.tags) and direct.model_turns == wire["model_turns"]
    assert direct.extra["failed_turn"] == wire["failed_turn"] and direct.error is None
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = write_validation_log(Path(tmp), 4, [Episode(result, uid="u", sample=0)], generation, split="val")
        (local_line,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert local_line == json.loads(json.dumps(direct.to_json_dict(max_message_chars=4000)))
