"""A short tool-use example conversation prepended to the prompt (``seal.rollout.few_shot``).

A small instruct model makes no tool calls zero-shot in this format; two worked examples teach it
the ``<tool_call>{json}</tool_call>`` shape, how tool results come back (``<tool_response>``
blocks in a user message, as the environment sends them) and that a plain reply ends the turn.
The examples use toy tools (``count_letters``, ``days_between``) that no BFCL class defines, each
introduced in its own user message, so they cannot leak a task's answer. Off in the paper recipe.
"""

from __future__ import annotations

import copy
import json
from typing import Any


def _example(tool: str, question: str, call: dict[str, Any], result: str, answer: str) -> tuple[dict[str, str], ...]:
    """One worked example: the question with its toy tool, the call, the tool's answer, the reply."""
    return ({"role": "user", "content": f"[Example] Tool for this example only: {tool}\n{question}"},
            {"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"},
            {"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>\n"},
            {"role": "assistant", "content": answer})


_EXAMPLES: tuple[dict[str, str], ...] = (
    *_example("count_letters(word: str, letter: str) -> int, counts how often `letter` occurs in `word`.",
              "How many times does the letter r occur in 'strawberry'?",
              {"name": "count_letters", "arguments": {"word": "strawberry", "letter": "r"}}, "3",
              "The letter r occurs 3 times in 'strawberry'."),
    *_example("days_between(start: str, end: str) -> int, dates as YYYY-MM-DD.",
              "How many days are there from 2024-03-01 to 2024-03-15?",
              {"name": "days_between", "arguments": {"start": "2024-03-01", "end": "2024-03-15"}}, "14",
              "There are 14 days from 2024-03-01 to 2024-03-15."),
)


def few_shot_messages() -> list[dict[str, str]]:
    """The example conversation (a fresh copy): user / assistant tool call / tool response /
    assistant answer, twice. Insert it between the system message and the task's first user turn."""
    return copy.deepcopy(list(_EXAMPLES))


def with_few_shot(messages: list[dict], enable: bool) -> list[dict]:
    """``[system, *examples, *rest]`` when ``enable``; ``messages`` unchanged otherwise."""
    if not enable:
        return list(messages)
    if not messages or messages[0].get("role") != "system":
        return few_shot_messages() + list(messages)
    return [messages[0], *few_shot_messages(), *messages[1:]]
