"""Rollout throughput: the same BFCL episodes run one at a time vs concurrently on the batching server.

Real SmolLM2-135M-Instruct, real environment (in-process), the episode runner
(``seal.rollout.agent_loop.SealAgentLoop``) and ``seal.engine.hf_server.HFServerManager``:

* ``sequential``: one episode at a time, server batch size 1;
* ``batched``: up to ``--concurrency`` episodes at once, server batch size ``--concurrency``.

Both modes use the same tasks, episodes per task, sampling settings, limits and server engine, each
with a fresh server (empty key/value cache). Prints generated tokens per second of wall time for
each mode and their ratio, plus batch sizes, cache reuse and the load average.

    .venv/bin/python scripts/bench_rollout.py
    .venv/bin/python scripts/bench_rollout.py --engine generate --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_TASKS = "multi_turn_base_100,multi_turn_base_104"
RELEVANT_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct"))
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated BFCL ids (small single-class tasks)")
    p.add_argument("--n", type=int, default=4, help="episodes per task (a GRPO group)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes at once in the batched mode")
    p.add_argument("--max-tokens-per-call", type=int, default=64)
    p.add_argument("--max-llm-calls", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["auto", "autocast", "fp32", "bf16"], default="auto",
                   help="auto: the local trainer's default (seal.local.autocast=auto): bf16 autocast over the "
                        "shared fp32 module where the CPU runs bf16 natively, else fp32; autocast: bf16 "
                        "autocast whatever the CPU (seal.local.autocast=bf16); fp32: no autocast "
                        "(seal.local.autocast=none); bf16: the server's private bf16 copy")
    p.add_argument("--engine", choices=["kv_cache", "generate"], default="kv_cache",
                   help="kv_cache: prefix key/value reuse (default); generate: one model.generate per batch")
    p.add_argument("--shared-prefix-min-tokens", type=int, default=None,
                   help="server option: rows sharing this many leading tokens read them once per step "
                        "(default: the server's; 0 = off, the ablation)")
    p.add_argument("--modes", default="sequential,batched")
    p.add_argument("--no-few-shot", action="store_true")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    return p.parse_args(argv)


def make_config(args: argparse.Namespace) -> Any:
    from seal.schema import default_config

    cfg = default_config()
    cfg.env_service.url = None
    cfg.seal.rollout.few_shot = not args.no_few_shot
    cfg.seal.rollout.max_llm_calls = args.max_llm_calls
    cfg.seal.rollout.max_tokens_per_call = args.max_tokens_per_call
    # The model path lets the agent loop name the checkpoint's model type to verl's token builder.
    cfg.actor_rollout_ref = {"model": {"path": str(args.model)},
                             "rollout": {"prompt_length": 7168, "response_length": 1024, "max_model_len": 8192}}
    return cfg


async def run_mode(mode: str, args: argparse.Namespace, model: Any, tokenizer: Any, client: Any) -> dict:
    import torch

    from seal.rollout.agent_loop import SealAgentLoop
    from seal.engine.hf_server import HFServerManager

    batch = 1 if mode == "sequential" else args.concurrency
    server = HFServerManager(model, tokenizer, max_batch_size=batch,
                             dtype=torch.bfloat16 if args.dtype == "bf16" else None,
                             autocast_dtype=args.autocast_dtype,
                             seed=args.seed, prefix_cache_tokens=0 if args.engine == "generate" else 131072,
                             **({} if args.shared_prefix_min_tokens is None
                                else {"shared_prefix_min_tokens": args.shared_prefix_min_tokens}))
    cfg = make_config(args)
    rows = [t for t in args.tasks.split(",") for _ in range(args.n)]
    sampling = {"temperature": args.temperature, "top_p": 1.0}
    gate = asyncio.Semaphore(batch)

    async def one(task_id: str) -> Any:
        async with gate:
            loop = SealAgentLoop.for_local(cfg, server, tokenizer, env_client=client)
            return await loop.run(dict(sampling), task_id=task_id, rollout_mode="sample")

    load_before = os.getloadavg()
    started = time.monotonic()
    outs = await asyncio.gather(*(one(t) for t in rows))
    wall = time.monotonic() - started
    stats = server.stats.as_dict()
    server.close()
    calls = sum(o.extra_fields["num_llm_calls"] for o in outs)
    cache = server.prefix_cache
    return {
        "mode": mode, "episodes": len(outs), "llm_calls": calls, "wall_s": round(wall, 2),
        "generated_tokens": stats["generated_tokens"],
        "tokens_per_s": round(stats["generated_tokens"] / wall, 2),
        "generate_s": stats["generate_seconds"], "prefill_s": stats["prefill_seconds"],
        "decode_s": stats["decode_seconds"], "mean_batch_size": stats["mean_batch_size"],
        "mean_prompt_tokens": round(sum(len(o.prompt_ids) for o in outs) / len(outs)),
        "mean_response_tokens": round(sum(len(o.response_ids) for o in outs) / len(outs)),
        "cache_reused_tokens": cache.reused_tokens if cache is not None else 0,
        "faults": sum(bool(o.extra_fields["excluded"]) for o in outs),
        "mean_reward": round(sum(o.reward_score or 0.0 for o in outs) / len(outs), 3),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }


def describe_precision(dtype: str) -> Any:
    """Print the CPU's bf16-relevant flags and the precision chosen; returns the server's autocast dtype."""
    import torch

    from seal.engine import precision

    flags = precision.cpu_flags()
    shown = sorted(f for f in (flags or ()) if f in RELEVANT_FLAGS) if flags is not None else ["(unknown)"]
    print(f"cpu flags: {' '.join(shown) or '(none of ' + ', '.join(RELEVANT_FLAGS) + ')'}; "
          f"torch kernels {torch.backends.cpu.get_cpu_capability()}, "
          f"oneDNN bf16 {bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}")
    setting = {"auto": "auto", "autocast": "bf16", "fp32": "none", "bf16": "none"}[dtype]
    choice = precision.resolve_autocast(setting, "cpu")
    label = "private bf16 weights" if dtype == "bf16" else (
        "fp32 (no autocast)" if choice.dtype is None else "bf16 autocast over fp32 weights")
    print(f"precision: --dtype {dtype} -> {label} ({choice.reason})")
    return choice.dtype


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from env_service.client import EnvClient

    if not Path(args.model).is_dir():
        print(f"bench_rollout: --model {args.model}: no such model folder (run install.sh or "
              "scripts/prepare_model.py)", file=sys.stderr)
        return 1
    unknown = [m for m in args.modes.split(",") if m not in ("sequential", "batched")]
    if unknown:
        print(f"bench_rollout: --modes {args.modes}: unknown mode {unknown[0]!r} (choose sequential, batched)",
              file=sys.stderr)
        return 1
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    print(f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, load average {os.getloadavg()}")
    args.autocast_dtype = describe_precision(args.dtype)
    results = []
    with EnvClient.in_process() as client:
        for mode in args.modes.split(","):
            res = asyncio.run(run_mode(mode, args, model, tokenizer, client))
            results.append(res)
            print(json.dumps(res))
    by_mode = {r["mode"]: r for r in results}
    if {"sequential", "batched"} <= set(by_mode):
        ratio = by_mode["batched"]["tokens_per_s"] / max(by_mode["sequential"]["tokens_per_s"], 1e-9)
        print(f"sequential {by_mode['sequential']['tokens_per_s']:.1f} tok/s | "
              f"batched {by_mode['batched']['tokens_per_s']:.1f} tok/s | ratio {ratio:.2f}x")
        results.append({"ratio": round(ratio, 2)})
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
