"""Template increments and loss masks against the real SmolLM2 tokenizer and chat template."""

from __future__ import annotations

from typing import Any

import pytest

from seal.rollout.few_shot import few_shot_messages, with_few_shot
from seal.rollout.tokens import ChatFormat, ChatTemplateError, TokenTrace, clip_text, encode, render

SYSTEM = {"role": "system", "content": "You can call tools.\n<tools>\n{\"name\": \"ls\"}\n</tools>"}
USER = {"role": "user", "content": "List the files, please."}
REPLIES = [
    '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>',
    "The folder holds a.txt and b.txt.",
    "Done: nothing else to do.",
]
OBSERVATIONS = ["<tool_response>\n['a.txt', 'b.txt']\n</tool_response>\n", "Now delete b.txt."]


def _run(fmt: ChatFormat, tokenizer: Any, eos_id: int, messages: list[dict], replies: list[str],
         observations: list[str], cut_last: bool = False) -> tuple[TokenTrace, list[dict], list[list[int]]]:
    """Play a scripted episode exactly as the runner does: model ids appended raw, observations as increments."""
    trace = TokenTrace(fmt.prompt_ids(messages))
    messages = list(messages)
    generated: list[list[int]] = []
    contexts: list[list[int]] = []
    for i, reply in enumerate(replies):
        if i > 0:
            trace.add_env(fmt.observation_ids(generated[-1], "user", observations[i - 1]))
            messages.append({"role": "user", "content": observations[i - 1]})
        contexts.append(trace.context)
        ids = encode(tokenizer, reply)
        if not (cut_last and i == len(replies) - 1):
            ids = ids + [eos_id]
        trace.add_model(ids, [-1.0] * len(ids))
        generated.append(ids)
        messages.append({"role": "assistant", "content": reply})
    return trace, messages, contexts


@pytest.fixture(scope="module")
def fmt(tokenizer: Any) -> ChatFormat:
    return ChatFormat.from_tokenizer(tokenizer)


def test_format_pieces_come_from_the_template(fmt: ChatFormat, tokenizer: Any, eos_id: int) -> None:
    opened = render(tokenizer, [SYSTEM, USER], add_generation_prompt=True)
    closed = render(tokenizer, [SYSTEM, USER], add_generation_prompt=False)
    assert tokenizer.decode(list(fmt.generation_header)) == opened[len(closed):]
    # The closing starts with the token the model emits to end its message.
    assert fmt.assistant_close[0] == eos_id
    assert fmt.close_ids([5, eos_id]) == list(fmt.assistant_close[1:])
    assert fmt.close_ids([5, 6]) == list(fmt.assistant_close)


@pytest.mark.parametrize("few_shot", [False, True])
def test_round_trip_equals_template_rendering(fmt: ChatFormat, tokenizer: Any, eos_id: int, few_shot: bool) -> None:
    start = with_few_shot([SYSTEM, USER], few_shot)
    trace, messages, _ = _run(fmt, tokenizer, eos_id, start, REPLIES, OBSERVATIONS)
    tail = fmt.close_ids(trace.response_ids)  # the template's closing after the final EOS
    decoded = tokenizer.decode(trace.prompt_ids + trace.response_ids + tail, skip_special_tokens=False)
    assert decoded == render(tokenizer, messages, add_generation_prompt=False)
    # The prompt alone is exactly [system, (examples), user] with the generation header.
    assert tokenizer.decode(trace.prompt_ids) == render(tokenizer, start, add_generation_prompt=True)


def test_mask_covers_exactly_the_model_tokens(fmt: ChatFormat, tokenizer: Any, eos_id: int) -> None:
    trace, _, _ = _run(fmt, tokenizer, eos_id, [SYSTEM, USER], REPLIES, OBSERVATIONS)
    assert len(trace.response_mask) == len(trace.response_ids) == len(trace.response_logprobs)
    masked = [t for t, m in zip(trace.response_ids, trace.response_mask) if m]
    expected = [t for r in REPLIES for t in encode(tokenizer, r) + [eos_id]]
    assert masked == expected
    # Each assistant span is preceded by the generation header, which is not trained on.
    header = list(fmt.generation_header)
    ids, mask = trace.response_ids, trace.response_mask
    starts = [i for i in range(1, len(mask)) if mask[i] == 1 and mask[i - 1] == 0]
    assert len(starts) == len(REPLIES) - 1
    for s in starts:
        assert ids[s - len(header):s] == header
        assert mask[s - len(header):s] == [0] * len(header)
    assert trace.response_mask[0] == 1  # the first reply starts the response (its header is in the prompt)
    assert trace.prompt_ids[-len(header):] == header
    assert [lp for lp, m in zip(trace.response_logprobs, mask) if not m] == [0.0] * mask.count(0)


def test_no_drift_each_context_extends_the_previous(fmt: ChatFormat, tokenizer: Any, eos_id: int) -> None:
    trace, _, contexts = _run(fmt, tokenizer, eos_id, [SYSTEM, USER], REPLIES, OBSERVATIONS)
    for before, after in zip(contexts, contexts[1:]):
        assert after[: len(before)] == before
    assert trace.context[: len(contexts[-1])] == contexts[-1]


def test_cut_generation_gets_the_full_closing(fmt: ChatFormat, tokenizer: Any, eos_id: int) -> None:
    replies = [("A long answer that was cut"), "ok"]
    trace = TokenTrace(fmt.prompt_ids([SYSTEM, USER]))
    cut = encode(tokenizer, replies[0])  # no EOS: the length limit stopped it
    trace.add_model(cut, None)
    inc = fmt.observation_ids(cut, "user", "go on")
    assert inc[: len(fmt.assistant_close)] == list(fmt.assistant_close)
    trace.add_env(inc)
    messages = [SYSTEM, USER, {"role": "assistant", "content": replies[0]}, {"role": "user", "content": "go on"}]
    assert tokenizer.decode(trace.context) == render(tokenizer, messages, add_generation_prompt=True)
    assert trace.has_logprobs is False  # one call came without log-probs


def test_clip_text(tokenizer: Any) -> None:
    text = "word " * 500
    clipped, was = clip_text(tokenizer, text, 50)
    assert was and len(encode(tokenizer, clipped)) < 70 and clipped.endswith("[truncated]")
    assert clip_text(tokenizer, "short", 50) == ("short", False)
    with pytest.raises(ValueError, match="max_env_tokens"):
        clip_text(tokenizer, "x", 0)


def test_rewriting_template_is_rejected() -> None:
    class Rewriting:
        """A template that renders the LAST message first: not append-only."""

        def apply_chat_template(self, messages: list[dict], tokenize: bool, add_generation_prompt: bool) -> str:
            body = "".join(f"[{m['role']}]{m['content']}" for m in reversed(messages))
            return body + ("[assistant]" if add_generation_prompt else "")

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text]

    with pytest.raises(ChatTemplateError, match="append-only"):
        ChatFormat.from_tokenizer(Rewriting())


def test_few_shot_examples_use_no_bfcl_tool() -> None:
    from env_service.bfcl.tasks import default_store

    store = default_store()
    bfcl_names = {d["name"] for tid in store.ids() for d in store.get(tid).tools}
    msgs = few_shot_messages()
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"] * 2
    called = [m["content"] for m in msgs if m["role"] == "assistant" and "<tool_call>" in m["content"]]
    assert len(called) == 2
    for text in called:
        import json

        name = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])["name"]
        assert name not in bfcl_names
    assert with_few_shot([SYSTEM, USER], True)[1:-1] == msgs
