"""Throughput of the environment service: oracle episodes over HTTP vs. in-process.

Each episode is ``create`` -> the oracle's assistant messages (per turn: all ground-truth calls in one
message, then a plain reply) -> ``evaluate`` (full result) -> ``release``. The floor runs the same
operations on an :class:`~env_service.host.EpisodeHost` in this process, without HTTP or worker
processes. The HTTP runs go to ``python -m env_service`` started here as a subprocess; the clients are
``concurrency`` asyncio tasks in this process using ``EnvClient``'s async calls (they share the
machine's cores with the service).

    .venv/bin/python scripts/bench_env_service.py                  # 1, 8, 32, 256 clients, 800 episodes each
    .venv/bin/python scripts/bench_env_service.py --repeat 3 --json bench.json   # medians of 3 rounds

256 clients is the paper's load: one training step runs 32 tasks x 8 rollouts at once. The summary
prints the throughput at the highest concurrency against the 32-client figure, and the service's CPU
time per episode (server process plus workers) against the in-process floor's, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from env_service.bfcl.episode import BfclEpisode  # noqa: E402
from env_service.bfcl.tasks import default_store  # noqa: E402
from env_service.client import EnvClient, EnvError  # noqa: E402
from env_service.host import score_of  # noqa: E402
from env_service.kit import episode_host  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def episode_plan(n: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """``n`` (task id, oracle messages) pairs, cycling through all 800 tasks in a seeded order."""
    store = default_store()
    ids = store.ids()
    random.Random(seed).shuffle(ids)
    return [(ids[i % len(ids)], BfclEpisode.oracle(store.get(ids[i % len(ids)]))) for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_floor(plan: list[tuple[str, list[str]]], params: dict) -> dict:
    """The same operations on an in-process host: no HTTP, no IPC, one process."""
    host = episode_host("bfcl")
    steps: list[tuple[float, bool]] = []
    passed = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for k, (task_id, messages) in enumerate(plan):
        iid = f"floor-{k}"
        host.handle("create", iid, {"task_id": task_id, "params": params})
        for content in messages:
            s0 = time.perf_counter()
            terminated = host.handle("step", iid, {"content": content})[1]
            steps.append((time.perf_counter() - s0, terminated))
        passed += score_of(host.handle("evaluate", iid, {"sparse": False})) == 1.0
        host.handle("release", iid, {})
    wall = time.perf_counter() - t0
    return {"episodes": len(plan), "passed": passed, "wall_s": wall, "eps_per_s": len(plan) / wall,
            "cpu_ms_per_episode": 1e3 * (time.process_time() - cpu0) / len(plan), **step_stats(steps)}


def step_stats(steps: list[tuple[float, bool]]) -> dict:
    """p50/p90/p99 of /step latency, and p99 without the final steps (those run the BFCL checker)."""
    every = [t for t, _ in steps]
    inner = [t for t, terminated in steps if not terminated]
    return {"step_p50_ms": 1e3 * percentile(every, 0.5), "step_p90_ms": 1e3 * percentile(every, 0.9),
            "step_p99_ms": 1e3 * percentile(every, 0.99), "step_p99_nonfinal_ms": 1e3 * percentile(inner, 0.99)}


class RssSampler(threading.Thread):
    """Samples the service's RSS (server process + its workers) every ``period`` seconds."""

    def __init__(self, pid: int, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.period = period
        self.samples: list[int] = []
        self._stop_event = threading.Event()

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process and its workers so far."""
        return sum(self.cpu_split_s())

    def cpu_split_s(self) -> tuple[float, float]:
        """(server process, worker processes) CPU seconds so far."""
        parts = [0.0, 0.0]
        for k, p in enumerate([self.proc] + self.proc.children(recursive=True)):
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            parts[min(k, 1)] += t.user + t.system
        return parts[0], parts[1]

    def rss(self) -> int:
        procs = [self.proc] + self.proc.children(recursive=True)
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def run(self) -> None:
        while not self._stop_event.wait(self.period):
            self.samples.append(self.rss())

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def run_http(client: EnvClient, plan: list[tuple[str, list[str]]], params: dict, concurrency: int,
             server_pid: int) -> dict:
    """``concurrency`` asyncio clients (one thread, the client's async API) replaying ``plan``."""
    steps: list[tuple[float, bool]] = []
    passed = 0

    async def one(task_id: str, messages: list[str]) -> None:
        nonlocal passed
        ep = await client.acreate(task_id, params)
        for content in messages:
            s0 = time.perf_counter()
            out = await client.astep(ep.instance_id, content)
            steps.append((time.perf_counter() - s0, out.terminated))
        ok = score_of(await client.aevaluate(ep.instance_id)) == 1.0
        passed += ok  # not in one statement with the await: `x += await ...` loses concurrent updates
        await client.arelease(ep.instance_id)

    errors: list[str] = []

    async def drive() -> None:
        queue = list(reversed(plan))

        async def lane() -> None:
            while queue:
                try:
                    await one(*queue.pop())
                except EnvError as err:  # counted, not fatal: the run reports how many
                    errors.append(f"{type(err).__name__}:{err.status}:{err.code}")

        await asyncio.gather(*(lane() for _ in range(concurrency)))
        await client.aclose()

    sampler = RssSampler(server_pid)
    me = psutil.Process()
    (server_cpu0, worker_cpu0), client_cpu0 = sampler.cpu_split_s(), sum(me.cpu_times()[:2])
    sampler.start()
    t0 = time.perf_counter()
    asyncio.run(drive())
    wall = time.perf_counter() - t0
    sampler.stop()
    server_cpu, worker_cpu = (b - a for a, b in zip((server_cpu0, worker_cpu0), sampler.cpu_split_s()))
    service_cpu, client_cpu = server_cpu + worker_cpu, sum(me.cpu_times()[:2]) - client_cpu0
    return {"concurrency": concurrency, "episodes": len(plan), "passed": passed, "errors": len(errors), "wall_s": wall,
            "eps_per_s": len(plan) / wall, **step_stats(steps),
            # CPU per episode does not depend on what else runs on the machine, unlike episodes/s.
            "service_cpu_ms_per_episode": 1e3 * service_cpu / len(plan),
            "server_cpu_ms_per_episode": 1e3 * server_cpu / len(plan),
            "worker_cpu_ms_per_episode": 1e3 * worker_cpu / len(plan),
            "client_cpu_ms_per_episode": 1e3 * client_cpu / len(plan),
            "rss_max_mb": max(sampler.samples or [sampler.rss()]) / 2**20}


def start_service(port: int, workers: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "env_service", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    probe = EnvClient(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    while not probe.healthz():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the service did not come up (exit code {proc.poll()})")
        time.sleep(0.2)
    probe.close()
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=800, help="episodes per run (default 800)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 256])
    ap.add_argument("--workers", type=int, default=None, help="service worker processes (default: one per CPU)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of (floor, every concurrency), interleaved; medians are reported (default 1)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    params: dict = {}
    plan = episode_plan(args.episodes)
    episodes_steps = sum(len(m) for _, m in plan)
    print(f"plan: {len(plan)} oracle episodes, {episodes_steps} steps ({episodes_steps / len(plan):.1f}/episode); "
          f"{psutil.cpu_count()} CPUs, load average {psutil.getloadavg()[0]:.1f}")

    port = free_port()
    proc = start_service(port, args.workers)
    floors: list[dict] = []
    rounds: list[list[dict]] = []
    try:
        client = EnvClient(f"http://127.0.0.1:{port}", max_connections=max(args.concurrency))
        run_http(client, plan[: min(len(plan), 50)], params, 8, proc.pid)  # warm-up
        idle_rss = RssSampler(proc.pid).rss() / 2**20
        for k in range(args.repeat):
            floors.append(run_floor(plan, params))
            print_floor(f"round {k + 1} in-process floor", floors[-1])
            rounds.append([run_http(client, plan, params, c, proc.pid) for c in args.concurrency])
            for r in rounds[-1]:
                print_http(f"round {k + 1} HTTP", r, floors[-1]["eps_per_s"])
        metrics = client.metrics()
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    floor = median_run(floors)
    results = [median_run([rnd[i] for rnd in rounds]) for i in range(len(args.concurrency))]
    print(f"--- medians over {args.repeat} round(s); ratio = HTTP episodes/s / floor episodes/s")
    print_floor("in-process floor", floor)
    for r in results:
        r["ratio_to_floor"] = r["eps_per_s"] / floor["eps_per_s"]
        print_http("HTTP", r, floor["eps_per_s"])
    print_summary(floor, results)
    print(f"service RSS after warm-up, idle: {idle_rss:.0f} MB; workers {metrics['workers']}; "
          f"server-side /v1/step p50 {metrics['latency'].get('/v1/step', {}).get('p50_ms', float('nan')):.2f} ms")
    if args.json:
        args.json.write_text(json.dumps({"floor": floor, "http": results, "rounds": rounds, "floors": floors,
                                         "idle_rss_mb": idle_rss}, indent=2))


def print_summary(floor: dict, results: list[dict]) -> None:
    """The paper-load checks: errors, throughput at the top concurrency vs 32, service CPU vs the floor."""
    by_c = {r["concurrency"]: r for r in results}
    top = by_c[max(by_c)]
    failed = sum(r["episodes"] - r["passed"] for r in results)
    print(f"errors: {sum(r['errors'] for r in results)}; episodes not passing: {failed} "
          f"(the floor: {floor['episodes'] - floor['passed']} of {floor['episodes']})")
    if 32 in by_c and max(by_c) > 32:
        print(f"throughput c={top['concurrency']} / c=32: {top['eps_per_s'] / by_c[32]['eps_per_s']:.2f} (target >= 0.9)")
    for r in results:
        ratio = r["service_cpu_ms_per_episode"] / floor["cpu_ms_per_episode"]
        print(f"service CPU per episode c={r['concurrency']}: {r['service_cpu_ms_per_episode']:.1f} ms "
              f"(server {r['server_cpu_ms_per_episode']:.1f} + workers {r['worker_cpu_ms_per_episode']:.1f}) vs "
              f"floor {floor['cpu_ms_per_episode']:.1f} ms: {ratio:.1f}x")


def median_run(runs: list[dict]) -> dict:
    """The run with the median episodes/s (a real run, so its latencies belong to it)."""
    return sorted(runs, key=lambda r: r["eps_per_s"])[(len(runs) - 1) // 2]


def print_floor(label: str, floor: dict) -> None:
    print(f"{label}: {floor['eps_per_s']:.1f} episodes/s, step p50 {floor['step_p50_ms']:.3f} "
          f"p99 {floor['step_p99_ms']:.3f} ms (non-final p99 {floor['step_p99_nonfinal_ms']:.3f} ms), "
          f"passed {floor['passed']}/{floor['episodes']}, CPU {floor['cpu_ms_per_episode']:.1f} ms/episode")


def print_http(label: str, r: dict, floor_eps: float) -> None:
    print(f"{label} c={r['concurrency']:>3}: {r['eps_per_s']:7.1f} episodes/s  ratio {r['eps_per_s'] / floor_eps:.3f}  "
          f"step p50 {r['step_p50_ms']:.2f} p90 {r['step_p90_ms']:.2f} p99 {r['step_p99_ms']:.2f} ms "
          f"(non-final p99 {r['step_p99_nonfinal_ms']:.2f})  passed {r['passed']}/{r['episodes']}  "
          f"service RSS max {r['rss_max_mb']:.0f} MB  CPU ms/episode: service {r['service_cpu_ms_per_episode']:.1f} "
          f"client {r['client_cpu_ms_per_episode']:.1f}")


if __name__ == "__main__":
    main()
