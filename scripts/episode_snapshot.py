"""A snapshot of what the environment and A-Patch make of scripted episodes, to compare two commits.

For every task of a split, plays the oracle and five perturbations of it (the first call-bearing
turn skipped, replaced by an unknown function, by a malformed call, or with its first call
duplicated; the last call of every multi-call turn dropped) in both rollout modes (``sample``:
the training interface with its hints; ``validate``) through the in-process environment, and
writes one JSON line per episode: the verdict, the failure tags, the error type, a digest of every
observation (hints included) and the episode's A-Patch scale under the release's default weights.

    python scripts/episode_snapshot.py --out /tmp/new.jsonl
    git worktree add /tmp/old <commit>
    python scripts/episode_snapshot.py --tree /tmp/old --out /tmp/old.jsonl   # that commit's code
    cmp /tmp/old.jsonl /tmp/new.jsonl    # identical: a refactor changed no verdict, tag, hint or scale

Prints the episode count, the pass count and the tag counts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

PROJECT = Path(__file__).resolve().parents[1]

MODES = ("sample", "validate")
UNKNOWN_CALL = '<tool_call>\n{"name": "no_such_function", "arguments": {}}\n</tool_call>'
MALFORMED_CALL = "<tool_call>\n{not json\n</tool_call>"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="eval", help="train | val | test | eval (the 400 held-out tasks; default)")
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks of the split")
    p.add_argument("--out", required=True, help="the JSON-lines file to write")
    p.add_argument("--tree", default=str(PROJECT),
                   help="the project checkout whose code plays the episodes (default: this one)")
    return p.parse_args(argv)


def scripted_episodes(task: Any) -> Iterator[tuple[str, list[str]]]:
    """``(variant, assistant messages)`` for the oracle and its perturbations."""
    try:
        from env_service.bfcl.episode import BfclEpisode
        from env_service.kit.oracle import ORACLE_REPLY, tool_call_message

        names = BfclEpisode.tool_parameters()
    except ImportError:  # a --tree whose oracle names positional arguments by the task's backend classes
        from env_service.oracle import ORACLE_REPLY, tool_call_message

        names = tuple(task.involved_classes)

    def messages(turns: list[Any]) -> list[str]:
        out: list[str] = []
        for calls in turns:
            if calls:
                out.append(calls if isinstance(calls, str) else tool_call_message(list(calls), names))
            out.append(ORACLE_REPLY)
        return out

    gt = [list(calls) for calls in task.gt_turns]
    yield "oracle", messages(gt)
    first = next((i for i, calls in enumerate(gt) if calls), None)
    if first is None:
        return

    def at_first(replacement: Any) -> list[Any]:
        return [replacement if i == first else calls for i, calls in enumerate(gt)]

    yield "skip_first", messages(at_first([]))
    yield "unknown_function", messages(at_first(UNKNOWN_CALL))
    yield "malformed_call", messages(at_first(MALFORMED_CALL))
    yield "duplicate_call", messages(at_first(gt[first] + gt[first][:1]))
    yield "drop_last_call", messages([calls[:-1] if len(calls) > 1 else calls for calls in gt])


def play(client: Any, task_id: str, mode: str, messages: list[str]) -> dict[str, Any]:
    created = client.create(task_id, {"rollout_mode": mode})
    observations = []
    try:
        for text in messages:
            step = client.step(created.instance_id, text)
            observations.append([step.observation, step.reward, step.terminated])
            if step.terminated:
                break
        verdict = client.evaluate(created.instance_id, False)
    finally:
        client.release(created.instance_id)
    digest = hashlib.sha256(json.dumps(observations, sort_keys=True, default=str).encode()).hexdigest()
    return {"valid": verdict.get("valid"), "tags": verdict.get("failure_tags"),
            "error_type": verdict.get("error_type"), "observations_sha256": digest[:16]}


def with_apatch_scales(rows: list[dict[str, Any]]) -> None:
    """Each row's A-Patch scale (one episode per row, unit advantages, the release's weights)."""
    import torch

    from seal.advantage.apatch import apatch_reweight
    from seal.advantage.weights import APatchConfig

    cfg = APatchConfig()
    step = cfg.warmup_steps + 1
    weights = dict(cfg.tag_weights)  # the static weights (no capability state)
    scaled, _ = apatch_reweight(torch.ones(len(rows), 1), [r["tags"] for r in rows], cfg=cfg, weights=weights,
                                step=step)
    for row, scale in zip(rows, scaled[:, 0].tolist()):
        row["apatch_scale"] = round(scale, 9)


def held_out_scope(reason: str) -> Any:
    """A final-evaluation scope for the split read: the snapshot plays scripted episodes (the oracle
    and its perturbations), so no policy and no choice sees the held-out tasks. A ``--tree`` older
    than the held-out guard reads them without one."""
    try:
        from seal_shared.held_out import final_evaluation
    except ImportError:
        return contextlib.nullcontext()
    return final_evaluation(reason)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tree = Path(args.tree).expanduser().resolve()
    if not (tree / "env_service" / "client.py").is_file():
        print(f"episode_snapshot: --tree {args.tree}: not a checkout of this project (no env_service/client.py)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(tree))
    import env_service
    import seal
    from env_service.bfcl.tasks import default_store, load_split
    from env_service.client import EnvClient

    for package in (env_service, seal):
        if not Path(package.__file__).resolve().is_relative_to(tree):
            print(f"episode_snapshot: --tree {args.tree}: {package.__name__} was imported from "
                  f"{Path(package.__file__).parent} instead", file=sys.stderr)
            return 2

    try:
        with held_out_scope(f"episode_snapshot --split {args.split} (scripted episodes, no policy)"):
            task_ids = load_split(args.split)[: args.limit]
    except (KeyError, ValueError, FileNotFoundError) as err:
        print(f"episode_snapshot: --split {args.split}: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        print(f"episode_snapshot: --out {out}: expected a file path in an existing folder", file=sys.stderr)
        return 2
    store, client, rows = default_store(), EnvClient.in_process(), []
    try:
        for task_id in tqdm(task_ids, desc=f"{args.split} tasks", unit="task"):
            for variant, messages in scripted_episodes(store.get(task_id)):
                for mode in MODES:
                    rows.append({"task": task_id, "variant": variant, "mode": mode,
                                 **play(client, task_id, mode, messages)})
    finally:
        client.close()
    with_apatch_scales(rows)
    out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    tags = Counter(t for r in rows for t in r["tags"] or [])
    print(f"{len(rows)} episodes, {sum(bool(r['valid']) for r in rows)} pass; tags {dict(tags.most_common())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
