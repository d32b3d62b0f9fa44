"""A ``server_manager`` that plays a task's ground truth, for replays through the episode runner.

:class:`OracleServer` answers each LLM call of one episode with the next of a task's oracle
assistant messages (``EnvClient.oracle``: in the tool-call syntax the episode's parser reads), in
verl's ``server_manager.generate`` contract, so the ground truth goes through the very runner
training and validation use: its prompt rendering, chat template, limits and checker
(``scripts/budget_replay.py``, the config task-budget test, the warm start's transcripts).
:func:`play_oracle` runs one such episode.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# What the server answers once the oracle's messages are used up (a plain reply ends a turn).
AFTER_THE_LAST = "Done."
END_OF_MESSAGE_TOKENS = ("<|im_end|>", "<|eot_id|>")


@dataclass(frozen=True)
class CutMessage:
    """An oracle message longer than the call's ``max_tokens``: call ``index`` (0-based) needed
    ``needed`` tokens (end-of-message token included) and was allowed ``allowed``."""

    index: int
    needed: int
    allowed: int


class OracleServer:
    """A ``server_manager`` whose ``generate`` answers each call with the next of ``messages``.

    Each answer is the message's tokens (``tokenizer.encode``, no special tokens) plus the
    end-of-message id the chat template closes an assistant message with (``<|im_end|>`` or
    ``<|eot_id|>`` when the vocabulary has one, else the tokenizer's eos), so the runner sees what
    a model that wrote exactly that message would produce. After the last message it answers
    ``"Done."``. Like a real server, an answer is cut to the request's ``max_tokens``
    (``stop_reason="length"``); each cut is recorded in :attr:`cut`. Not thread-safe: one episode
    per server.
    """

    def __init__(self, tokenizer: Any, messages: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.messages = list(messages)
        self.calls = 0
        self.cut: list[CutMessage] = []
        vocab = tokenizer.get_vocab()
        marker = next((t for t in END_OF_MESSAGE_TOKENS if t in vocab), None)
        self.eos = int(vocab[marker]) if marker is not None else int(tokenizer.eos_token_id)

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any],
                       **_: Any) -> Any:
        """The next oracle message as a verl ``TokenOutput`` (log-probs ``None``)."""
        from verl.workers.rollout.replica import TokenOutput

        text = self.messages[self.calls] if self.calls < len(self.messages) else AFTER_THE_LAST
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.eos]
        limit = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        stop = "completed"
        if limit is not None and len(ids) > int(limit):
            self.cut.append(CutMessage(self.calls, len(ids), int(limit)))
            ids, stop = ids[: int(limit)], "length"
        self.calls += 1
        return TokenOutput(token_ids=ids, log_probs=None, stop_reason=stop)


async def play_oracle(cfg: Any, tokenizer: Any, env_client: Any, task_id: str, messages: Sequence[str], *,
                      rollout_mode: str = "validate", env_params: Mapping[str, Any] | None = None
                      ) -> tuple[Any, OracleServer]:
    """One episode of ``task_id`` through :class:`~seal.rollout.agent_loop.SealAgentLoop` under
    ``cfg`` (its limits, interface and environment params), every LLM call answered from
    ``messages``. Returns the runner's ``AgentLoopOutput`` and the server (calls made, cuts)."""
    from seal.rollout.agent_loop import SealAgentLoop

    server = OracleServer(tokenizer, messages)
    runner = SealAgentLoop.for_local(cfg, server, tokenizer, env_client=env_client)
    kwargs: dict[str, Any] = {"task_id": task_id, "rollout_mode": rollout_mode}
    if env_params:
        kwargs["env_params"] = dict(env_params)
    return await runner.run({"temperature": 0.0}, **kwargs), server
