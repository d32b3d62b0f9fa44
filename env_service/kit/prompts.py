"""Prompt and observation text of the kit's episodes, in the release's three prompt modes.

* ``bfcl_qwen_fc`` (default): Qwen2.5's native tool preamble; tool results come back as
  ``<tool_response>`` blocks in a ``user`` message.
* ``llama31_official_fc`` (Llama 3.1's own JSON function calling) and ``toolace_fc`` (ToolACE's
  Python-list calls): tool results come back bare, in an ``ipython`` message.

Each ``render_*`` function says where its mode puts the docs and the extra instruction blocks
(interface evolution).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

TOOL_PROMPT_MODES: tuple[str, ...] = ("bfcl_qwen_fc", "llama31_official_fc", "toolace_fc")
TOOL_RESULT_MODES: tuple[str, ...] = ("bfcl_tool_response", "llama31_official", "toolace_official_prompt")
# Result modes whose observations are bare tool output in an ``ipython`` message (Llama 3.1's tool
# role); the release sends every other observation as a ``user`` message.
IPYTHON_RESULT_MODES: frozenset[str] = frozenset({"llama31_official", "toolace_official_prompt"})
# The tool_call_parser and tool_result_mode each prompt mode pairs with, used where a caller names
# the prompt mode only (the release had one global default, xml_json, whatever the prompt mode).
PROMPT_MODE_PAIRS: dict[str, tuple[str, str]] = {
    "bfcl_qwen_fc": ("xml_json", "bfcl_tool_response"),
    "llama31_official_fc": ("llama31_official_fc", "llama31_official"),
    "toolace_fc": ("toolace_fc", "toolace_official_prompt"),
}

CONVERSATION_COMPLETED = "[CONVERSATION_COMPLETED]"
INVALID_TOOL_CALL_PREFIX = "[ERROR] Invalid tool call format: "

_QWEN_TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>"
)
_QWEN_TOOLS_FOOTER = (
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


# Llama 3.1's built-in-tool system header, as the release sends it (a fixed date keeps prompts equal).
_LLAMA31_SYSTEM = "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"
_LLAMA31_INSTRUCTIONS = (
    "Given the following functions, please respond with a JSON for a function call with its proper "
    "arguments that best answers the given prompt.",
    "",
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.',
    "Do not use variables.",
    "Return only raw JSON for function calls; do not wrap the JSON in <tool_call> tags.",
    "If no function can be used, or required parameters are missing, answer briefly in plain text.",
    "",
)
_TOOLACE_HEADER = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.",
    "If none of the functions can be used, point it out. If the given question lacks the parameters "
    "required by the function, also point it out.",
    "You should only return the function call in tools call sections.",
    "If you decide to invoke any function(s), you MUST put them in the format of [func_name1(param_name1="
    "param_value1, param_name2=param_value2), func_name2(param=value)].",
    "You SHOULD NOT include any other text in the response.",
    "Here is a list of functions in JSON format that you can invoke:",
    "<tools>",
)
_TOOLACE_FOOTER = ("</tools>\n", 'Remember: output only a bracketed function-call list, e.g. [search(query="value")].')


def _with_blocks(prompt: str, extra_blocks: Iterable[str]) -> str:
    for block in extra_blocks:
        if block and block.strip():
            prompt += "\n\n" + block.strip()
    return prompt


def render_system_prompt(tools: list[dict[str, Any]], extra_blocks: Iterable[str] = ()) -> str:
    """The ``bfcl_qwen_fc`` system prompt for ``tools`` (BFCL func docs, one ``json.dumps(doc)`` a line
    inside ``<tools>``), plus extra blocks after a blank line."""
    lines = [_QWEN_TOOLS_HEADER, *(json.dumps(tool) for tool in tools), _QWEN_TOOLS_FOOTER]
    return _with_blocks("\n".join(lines), extra_blocks)


def render_toolace_system_prompt(tools: list[dict[str, Any]], extra_blocks: Iterable[str] = ()) -> str:
    """The ``toolace_fc`` system prompt: each doc as compact JSON with its ``parameters`` renamed
    ``arguments`` (ToolACE's training format), then the list-syntax reminder and extra blocks."""
    docs = [json.dumps({"name": t.get("name"), "description": t.get("description", ""),
                        "arguments": t.get("parameters", {})}, ensure_ascii=False, separators=(",", ":"))
            for t in tools]
    return _with_blocks("\n".join([*_TOOLACE_HEADER, *docs, *_TOOLACE_FOOTER]), extra_blocks)


def render_llama31_user_prompt(tools: list[dict[str, Any]], query: str, extra_blocks: Iterable[str] = ()) -> str:
    """The ``llama31_official_fc`` first user message (its system prompt is a short ``Environment:
    ipython`` header): instructions, each doc as indented JSON followed by a blank line, the extra
    blocks (then a blank line), and the query."""
    lines = list(_LLAMA31_INSTRUCTIONS)
    for tool in tools:
        lines += [json.dumps(tool, ensure_ascii=False, indent=4), ""]
    extras = [b.strip() for b in extra_blocks if b and b.strip()]
    if extras:
        lines += [*extras, ""]
    lines.append(query.strip())
    return "\n".join(lines).strip()


def render_initial_messages(mode: str, tools: list[dict[str, Any]], query: str,
                            extra_blocks: Iterable[str] = ()) -> list[dict[str, str]]:
    """``[system, first user]`` of an episode in prompt ``mode`` (one of :data:`TOOL_PROMPT_MODES`)."""
    blocks = list(extra_blocks)
    if mode == "bfcl_qwen_fc":
        system, user = render_system_prompt(tools, blocks), query
    elif mode == "toolace_fc":
        system, user = render_toolace_system_prompt(tools, blocks), query
    elif mode == "llama31_official_fc":
        system, user = _LLAMA31_SYSTEM, render_llama31_user_prompt(tools, query, blocks)
    else:
        raise ValueError(f"tool_prompt_mode {mode!r} is not supported; use one of {', '.join(TOOL_PROMPT_MODES)}")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def observation_role(result_mode: str) -> str:
    """The chat role of the environment's observations under ``result_mode``: ``ipython`` or ``user``."""
    return "ipython" if result_mode in IPYTHON_RESULT_MODES else "user"


def render_tool_responses(results: Iterable[str], hints: Iterable[str] | None = None,
                          mode: str = "bfcl_tool_response") -> str:
    """The observation for executed calls: each result in a ``<tool_response>`` block
    (``bfcl_tool_response``) or bare (the ipython modes); parts joined by newlines, trailing newline.

    ``hints`` (parallel to ``results``) are optional ``[ToolHint] ...`` lines placed right after
    the result of the failing call; empty strings add nothing.
    """
    if mode not in TOOL_RESULT_MODES:
        raise ValueError(f"tool_result_mode {mode!r} is not supported; use one of {', '.join(TOOL_RESULT_MODES)}")
    results = list(results)
    hint_list = list(hints) if hints is not None else [""] * len(results)
    if len(hint_list) != len(results):
        raise ValueError(f"{len(hint_list)} hints for {len(results)} results")
    parts: list[str] = []
    for result, hint in zip(results, hint_list):
        parts.append(result if mode in IPYTHON_RESULT_MODES else f"<tool_response>\n{result}\n</tool_response>")
        if hint:
            parts.append(hint)
    return "\n".join(parts) + "\n"


def render_invalid_tool_call(reason: str, feedback: str = "") -> str:
    """The observation for a rejected message: ``[ERROR] Invalid tool call format: <reason>``."""
    text = INVALID_TOOL_CALL_PREFIX + reason
    if feedback:
        text += "\n" + feedback.strip()
    return text
