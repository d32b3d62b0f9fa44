"""Does a policy call the tools when a turn needs it? Per turn of a validation log.

    python scripts/call_rate.py --conf exp/quickstart.yaml --log DIR_OR_FILE [--log ...]

For every ground-truth turn of every episode in the logs (``validation_log/<step>.jsonl`` lines,
greedy or sampled, from a trainer or ``seal eval``), read the assistant messages the model wrote in
that turn and report, per environment and overall:

* **call rate**: of the turns whose ground truth has calls, the share where the model made at
  least one call (a ``<tool_call>`` block);
* **closed instead**: of those turns, the share where the model's first message of the turn had no
  call, which ends the turn in the kit's protocol (the "Done." a warm start can learn from the
  transcripts' closing lines, said before any work);
* **abstained**: of the turns whose right move is no call, the share where the model made none.

A turn starts at the user message that carries the task's next user turn; an episode that ended
early leaves its remaining turns unplayed, counted apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CALL_MARK = "<tool_call>"


@dataclass
class TurnCounts:
    """Counts over the turns of some episodes."""

    needs_call: int = 0
    called: int = 0
    closed_first: int = 0
    no_call_turns: int = 0
    abstained: int = 0
    unplayed: int = 0
    episodes: int = 0
    first_words: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        rate = lambda k, n: round(k / n, 3) if n else None  # noqa: E731
        return {"episodes": self.episodes, "turns_needing_a_call": self.needs_call,
                "call_rate": rate(self.called, self.needs_call),
                "closed_instead": rate(self.closed_first, self.needs_call),
                "no_call_turns": self.no_call_turns, "abstained": rate(self.abstained, self.no_call_turns),
                "unplayed_turns": self.unplayed,
                "most_common_first_reply_without_call": self.first_words.most_common(3)}


def turns_of(messages: list[dict[str, Any]], user_turns: list[str]) -> list[list[str] | None]:
    """The assistant messages of each user turn (``None``: the turn was never reached)."""
    out: list[list[str] | None] = [None] * len(user_turns)
    k = -1
    for m in messages:
        role, content = m.get("role"), str(m.get("content") or "")
        if role == "user" and k + 1 < len(user_turns) and user_turns[k + 1].strip() and \
                user_turns[k + 1].strip() in content:
            k += 1
            out[k] = []
        elif role == "assistant" and k >= 0:
            out[k].append(content)
    return out


def count_episode(counts: TurnCounts, record: dict[str, Any], task: Any) -> None:
    counts.episodes += 1
    played = turns_of(record.get("messages") or [], [str(u) for u in task.user_turns])
    for gt, replies in zip(task.gt_turns, played):
        if replies is None:
            counts.unplayed += 1
            continue
        called = any(CALL_MARK in r for r in replies)
        if gt:
            counts.needs_call += 1
            counts.called += called
            if replies and CALL_MARK not in replies[0]:
                counts.closed_first += 1
                counts.first_words[replies[0].strip()[:40]] += 1
        else:
            counts.no_call_turns += 1
            counts.abstained += not called


def records(paths: list[Path]) -> list[dict[str, Any]]:
    files = [f for p in paths for f in (sorted(p.rglob("*.jsonl")) if p.is_dir() else [p])]
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conf", required=True, help="the experiment config whose environment the logs are of")
    ap.add_argument("--log", type=Path, nargs="+", required=True, help="validation log files or folders")
    ap.add_argument("--json", type=Path, help="also write the counts here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from env_service.registry import get_environment
    from seal.config import compose_config
    from seal.environment import environment, environment_name

    cfg = compose_config(args.conf, [])
    environment(cfg)  # imports the config's plug-in modules, which register their environment
    store = get_environment(environment_name(cfg)).task_store()
    counts = TurnCounts()
    rows = records(args.log)
    if not rows:
        print(f"call_rate: no log lines under {', '.join(map(str, args.log))}", file=sys.stderr)
        return 2
    for row in rows:
        count_episode(counts, row, store.get(str(row["task_id"])))
    summary = {"env": environment_name(cfg), **counts.as_dict()}
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
