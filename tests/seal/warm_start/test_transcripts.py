"""Oracle transcripts: what the warm start imitates is exactly a passing episode, token for token."""

from __future__ import annotations

import json

import pytest

from env_service.client import EnvClient
from env_service.notes.episode import default_store
from seal.config import ConfigError
from seal.warm_start.transcripts import build_transcripts

from .conftest import TASKS, notes_cfg


@pytest.fixture(scope="module")
def client():
    c = EnvClient.in_process(env="notes")
    yield c
    c.close()


def _trained_text(tokenizer, t) -> str:
    return tokenizer.decode([tok for tok, m in zip(t.response_ids, t.response_mask) if m])


def test_transcripts_train_only_the_ground_truth_calls_and_replies(tokenizer, client) -> None:
    transcripts = build_transcripts(notes_cfg(), tokenizer, client, TASKS)
    assert [t.task_id for t in transcripts] == TASKS
    store = default_store()
    for t in transcripts:
        trained = _trained_text(tokenizer, t)
        # Every ground-truth call is model-written (mask 1) and in order; no observation is.
        calls = [c for turn in store.get(t.task_id).gt_turns for c in turn]
        names = [c.split("(")[0] for c in calls]
        positions = [trained.index(f'"name": "{n}"') for n in names]
        assert positions == sorted(positions)
        assert "<tool_response>" not in trained
        untrained = tokenizer.decode([tok for tok, m in zip(t.response_ids, t.response_mask) if not m])
        assert untrained.count("<tool_response>") == len(calls)
        # The prompt is the runner's: it ends on the assistant header and holds the first user turn.
        prompt = tokenizer.decode(t.prompt_ids)
        assert prompt.rstrip().endswith("assistant") and store.get(t.task_id).user_turns[0] in prompt
        assert t.messages[0]["role"] == "system" and t.trained_tokens == sum(t.response_mask) > 0


def test_transcripts_use_the_training_interface(tokenizer, client) -> None:
    """observation_lite's hints are on in sample mode (training) and the transcripts carry them."""
    (t,) = build_transcripts(notes_cfg(), tokenizer, client, TASKS[:1])
    assert "[required]" in json.dumps(t.messages[0])
    (plain,) = build_transcripts(notes_cfg("env_service.notes.observation_lite.enable=false"), tokenizer, client,
                                 TASKS[:1])
    assert "[required]" not in json.dumps(plain.messages[0])


def test_a_task_whose_ground_truth_cannot_pass_is_refused(tokenizer, client) -> None:
    with pytest.raises(ConfigError, match=r"notes_007 \(max_llm_calls\).*seal.rollout.max_llm_calls"):
        build_transcripts(notes_cfg("seal.rollout.max_llm_calls=4"), tokenizer, client, TASKS)


def test_closing_lines_are_marked_and_only_they(tokenizer, client) -> None:
    """Each turn's closing line (the oracle's plain reply) is marked; no call token is."""
    transcripts = build_transcripts(notes_cfg(), tokenizer, client, TASKS)
    store = default_store()
    for t in transcripts:
        assert len(t.closing) == len(t.response_mask)
        closing = tokenizer.decode([tok for tok, c in zip(t.response_ids, t.closing) if c])
        calls = tokenizer.decode([tok for tok, m, c in zip(t.response_ids, t.response_mask, t.closing) if m and not c])
        assert "<tool_call>" not in closing and closing.count("Done.") == len(store.get(t.task_id).gt_turns)
        assert calls.count("<tool_call>") == sum(len(turn) for turn in store.get(t.task_id).gt_turns)
        assert all(m for m, c in zip(t.response_mask, t.closing) if c)  # only model-written tokens
        weights = t.token_weights(0.25)
        assert {w for w, c in zip(weights, t.closing) if c} == {0.25}
        assert t.token_weights(1.0) == [float(m) for m in t.response_mask]


def test_a_response_that_does_not_follow_the_plan_marks_nothing() -> None:
    from seal.warm_start.transcripts import closing_tokens

    assert closing_tokens([1, 1, 0, 1, 0, 1], [["a()"], []]) == (0, 0, 0, 1, 0, 1)
    assert closing_tokens([1, 1, 0, 1], [["a()"], []]) == ()  # one run short of the plan
