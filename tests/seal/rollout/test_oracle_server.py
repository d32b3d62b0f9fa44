"""OracleServer answers with the given messages in verl's generate contract, and a task's oracle is
written in the syntax of whichever tool-call parser the episode uses."""

from __future__ import annotations

import asyncio

import pytest

from env_service.kit.parsers import parse_tool_calls
from env_service.bfcl.tasks import default_store
from env_service.client import EnvClient
from seal.rollout.oracle_server import AFTER_THE_LAST, OracleServer

# `tokenizer`: SmolLM2's, from tests/seal/conftest.py.

def test_answers_in_order_ends_each_message_and_cuts_at_max_tokens(tokenizer) -> None:
    server = OracleServer(tokenizer, ["first answer", "second"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def calls() -> list:
        return [await server.generate("r", [1, 2], {"max_tokens": 64}),
                await server.generate("r", [1, 2], {"max_tokens": 1}),
                await server.generate("r", [1, 2], {})]

    first, second, after = asyncio.run(calls())
    assert first.token_ids[-1] == end and first.stop_reason == "completed" and first.log_probs is None
    assert tokenizer.decode(first.token_ids[:-1]) == "first answer"
    assert len(second.token_ids) == 1 and second.stop_reason == "length"
    assert [(c.index, c.allowed) for c in server.cut] == [(1, 1)]
    assert tokenizer.decode(after.token_ids[:-1]) == AFTER_THE_LAST and server.calls == 3


@pytest.mark.parametrize("parser", ["xml_json", "toolace_fc", "llama31_official_fc"])
def test_oracle_messages_parse_back_to_the_ground_truth_calls(parser: str) -> None:
    """multi_turn_base_0 has turns of 3, 2, 1 and 4 calls, some with positional arguments."""
    with EnvClient.in_process(env="bfcl") as client:
        gt_turns, messages = client.oracle("multi_turn_base_0", parser)
    assert gt_turns == [list(t) for t in default_store().get("multi_turn_base_0").gt_turns]
    calls = [m for m in messages if m != AFTER_THE_LAST]
    assert len(messages) == len(calls) + len(gt_turns)
    for message, gt in zip(calls, [t for t in gt_turns if t]):
        parsed = parse_tool_calls(message, parser)
        assert not parsed.errors and [c.name for c in parsed.calls] == [g.split("(", 1)[0] for g in gt]
