"""Soak the environment service: many episodes at high concurrency; errors and memory growth.

Starts ``python -m env_service`` as a subprocess, warms it up, samples its RSS (server process plus
workers), replays ``--episodes`` oracle episodes (every fifth with a malformed tool call and a failing
call mixed in) at ``--concurrency`` asyncio clients, samples RSS again and prints the growth.

    .venv/bin/python scripts/soak_env_service.py                        # 2,000 episodes, 256 clients

256 clients is the paper's load (32 tasks x 8 rollouts per training step).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_env_service import RssSampler, episode_plan, free_port, start_service  # noqa: E402

from env_service.client import EnvClient, EnvError  # noqa: E402

NOISE = ["<tool_call>{\"name\": \"ls\", \"arguments\": {oops}}</tool_call>",
         "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"no_such_folder\"}}\n</tool_call>"]


async def replay(client: EnvClient, plan: list[tuple[str, list[str]]], concurrency: int) -> tuple[int, Counter]:
    """Run every episode of ``plan``; returns (episodes completed, errors by type)."""
    queue = list(reversed(list(enumerate(plan))))
    errors: Counter = Counter()
    completed = 0

    async def one(k: int, task_id: str, messages: list[str]) -> None:
        nonlocal completed
        script = messages[:1] + NOISE + messages[1:] if k % 5 == 0 else messages
        ep = await client.acreate(task_id, {"enforce_available_tools": False})
        try:
            out = None
            for content in script:
                out = await client.astep(ep.instance_id, content)
            if out is None or not out.terminated:
                errors["not_terminated"] += 1
            await client.aevaluate(ep.instance_id)
        finally:
            await client.arelease(ep.instance_id)
        completed += 1

    async def lane() -> None:
        while queue:
            k, (task_id, messages) = queue.pop()
            try:
                await one(k, task_id, messages)
            except EnvError as err:
                errors[f"{type(err).__name__}:{err.status}:{err.code}"] += 1

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    await client.aclose()
    return completed, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--warmup", type=int, default=200, help="episodes before the first RSS sample")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()

    port = free_port()
    proc = start_service(port, args.workers)
    try:
        client = EnvClient(f"http://127.0.0.1:{port}", max_connections=args.concurrency)
        rss = RssSampler(proc.pid)
        asyncio.run(replay(client, episode_plan(args.warmup, seed=1), args.concurrency))
        rss_warm = rss.rss()
        t0 = time.perf_counter()
        rss.start()
        completed, errors = asyncio.run(replay(client, episode_plan(args.episodes, seed=2), args.concurrency))
        wall = time.perf_counter() - t0
        rss.stop()
        rss_end = rss.rss()
        metrics = client.metrics()
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    growth = 100.0 * (rss_end - rss_warm) / rss_warm
    print(f"episodes: {completed}/{args.episodes} completed at concurrency {args.concurrency} in {wall:.0f} s "
          f"({completed / wall:.1f} episodes/s)")
    print(f"errors: {sum(errors.values())} {dict(errors)}")
    print(f"service RSS: {rss_warm / 2**20:.0f} MB after warm-up, {rss_end / 2**20:.0f} MB at the end, "
          f"max {max(rss.samples or [rss_end]) / 2**20:.0f} MB during; growth {growth:+.1f} %")
    print(f"service metrics: live {metrics['instances_live']}, created {metrics['created_total']}, "
          f"released {metrics['released_total']}, reaped {metrics['reaped_total']}, lost {metrics['lost_total']}, "
          f"errors {metrics['errors_total']}")


if __name__ == "__main__":
    main()
