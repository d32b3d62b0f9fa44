"""An OpenAI-compatible chat server that replays ORACLE calls, for testing ``seal eval``.

Given a conversation, it finds the task (the candidate whose first user message matches) and
the turn (each plain-text assistant reply advances one turn, as in the environment's protocol),
then answers with every ground-truth call of the turn as ``<tool_call>`` blocks; after the tool
results it answers in plain text to advance. Positional ground-truth arguments become keyword
arguments through the backend method signatures (``env_service.kit.oracle``).

    python tests/eval/stub_openai.py --port 8011 --tasks multi_turn_base_120,multi_turn_base_29
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from env_service.bfcl.episode import BfclEpisode  # noqa: E402
from env_service.bfcl.tasks import default_store  # noqa: E402
from env_service.kit.oracle import ORACLE_REPLY, tool_call_message  # noqa: E402

TOOL_CALL_OPEN = "<tool_call>"


def build_app(task_ids: list[str]) -> FastAPI:
    """The stub app over ``task_ids``; first user messages must identify them uniquely."""
    store = default_store()
    tasks = [store.get(t) for t in task_ids]
    by_first: dict[str, list[Any]] = {}
    for t in tasks:
        by_first.setdefault(t.user_message(0) or "", []).append(t)
    app = FastAPI()
    app.state.requests = 0

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> dict[str, Any]:
        app.state.requests += 1
        messages = body.get("messages") or []
        if len(messages) < 2:
            raise HTTPException(400, "expected [system, user, ...] messages")
        candidates = by_first.get(messages[1].get("content", ""), [])
        if len(candidates) != 1:
            raise HTTPException(422, f"first user message matches {len(candidates)} known tasks")
        text = _reply(candidates[0], messages)
        return {
            "id": f"stub-{app.state.requests}", "object": "chat.completion", "model": body.get("model", "stub"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": sum(len(str(m.get("content", ""))) for m in messages) // 4,
                      "completion_tokens": len(text) // 4},
        }

    return app


def _reply(task: Any, messages: list[dict[str, Any]]) -> str:
    assistant = [m.get("content", "") for m in messages if m.get("role") == "assistant"]
    turn = sum(1 for a in assistant if TOOL_CALL_OPEN not in a)
    if turn >= len(task.gt_turns):
        return ORACLE_REPLY
    calls = task.gt_turns[turn]
    already_called = bool(assistant) and TOOL_CALL_OPEN in assistant[-1]
    if calls and not already_called:
        return tool_call_message(calls, BfclEpisode.tool_parameters())
    return ORACLE_REPLY


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--tasks", required=True, help="comma-separated task ids the stub can replay")
    args = ap.parse_args()
    uvicorn.run(build_app(args.tasks.split(",")), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
