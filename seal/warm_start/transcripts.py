"""Oracle transcripts: the ground truth of training tasks played through the episode runner.

Each transcript is exactly what the policy would see and write in a perfect episode: the runner
(:class:`seal.rollout.agent_loop.SealAgentLoop`, the one training uses) renders the prompt with the
training interface and the chat template, and an :class:`~seal.rollout.oracle_server.OracleServer`
answers every LLM call with the task's next ground-truth message (the environment's ``/v1/oracle``). The
response tokens keep the runner's mask: 1 on what the model writes, 0 on observations. A transcript
whose replay does not pass the environment's checker is refused, so the warm start never imitates
an episode that the verifier would score as a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seal.config_base import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transcript:
    """One oracle episode. ``response_mask[i]`` is 1 where ``response_ids[i]`` is model-written."""

    task_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    messages: tuple[dict[str, Any], ...]
    # 1 where a model-written token belongs to a message that closes a turn without a call.
    closing: tuple[int, ...] = ()

    @property
    def trained_tokens(self) -> int:
        return sum(self.response_mask)

    def token_weights(self, closing_weight: float) -> list[float]:
        """Each response token's loss weight: 0 on observations, ``closing_weight`` on closing lines."""
        closing = self.closing or (0,) * len(self.response_mask)
        return [m * (closing_weight if c else 1.0) for m, c in zip(self.response_mask, closing)]


def closing_tokens(response_mask: Sequence[int], gt_turns: Sequence[Sequence[str]]) -> tuple[int, ...]:
    """Mark the tokens of the closing messages: the oracle plays each turn as one message with its
    calls (when it has any) and one plain reply, so the model-written runs of the response (maximal
    stretches of mask 1) alternate accordingly. ``()`` when the runs do not match that plan."""
    plan = [flag for calls in gt_turns for flag in ((0, 1) if calls else (1,))]
    runs: list[tuple[int, int]] = []
    for i, m in enumerate(response_mask):
        if m and (i == 0 or not response_mask[i - 1]):
            runs.append((i, i))
        if m:
            runs[-1] = (runs[-1][0], i + 1)
    if len(runs) != len(plan):
        return ()
    out = [0] * len(response_mask)
    for (start, end), flag in zip(runs, plan):
        out[start:end] = [flag] * (end - start)
    return tuple(out)


def build_transcripts(cfg: Any, tokenizer: Any, env_client: Any, task_ids: Sequence[str]) -> list[Transcript]:
    """One :class:`Transcript` per task, under ``cfg``'s episode budget and interface.

    Raises :class:`ConfigError` naming the tasks whose ground truth does not pass under the config
    (its limits cut it short, or the environment disagrees with its own labels)."""
    from seal.environment import env_params_block
    from seal.rollout.oracle_server import play_oracle

    parser = str(env_params_block(cfg).get("tool_call_parser") or "xml_json")
    out, failed = [], []
    for task_id in task_ids:
        gt_turns, messages = env_client.oracle(task_id, parser)
        result, _ = asyncio.run(play_oracle(cfg, tokenizer, env_client, task_id, messages, rollout_mode="sample"))
        fields = result.extra_fields
        if not (fields.get("check") or {}).get("valid"):
            failed.append(f"{task_id} ({fields.get('terminated_reason')})")
            continue
        mask = tuple(int(m) for m in result.response_mask)
        closing = closing_tokens(mask, gt_turns)
        if not closing:
            logger.warning("warm start: %s: cannot tell its closing lines apart (weighted as calls)", task_id)
        out.append(Transcript(task_id, tuple(result.prompt_ids), tuple(result.response_ids), mask,
                              tuple(dict(m) for m in fields.get("messages") or ()), closing))
    if failed:
        raise ConfigError(f"seal.warm_start: the ground truth of {len(failed)} task(s) does not pass under this "
                          f"config's limits: {', '.join(failed)}; raise seal.rollout.max_llm_calls or the "
                          "context budget, or leave these tasks out of seal.warm_start.task_ids")
    logger.info("warm start: %d oracle transcripts, %d trained tokens", len(out),
                sum(t.trained_tokens for t in out))
    return out
