"""Where one step of the local trainer spends its time: validation, rollout, reference pass,
update and checkpoint, with the generation server's own counters.

Builds the experiment's :class:`~seal.trainer.local.loop.LocalTrainer` (by default the
quickstart's: warm-started SmolLM2-135M-Instruct on ``notes``, environment in-process) in a
scratch folder and runs, in the order a run does: one validation pass, one training step, one
checkpoint. Prints each phase's seconds, and for the phases that generate: LLM calls, generated
tokens, server batches and their mean size, prefill and decode seconds.

    .venv/bin/python scripts/profile_step.py
    .venv/bin/python scripts/profile_step.py -- seal.local.shared_prefix_training=false
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--conf", default=str(REPO / "exp" / "quickstart.yaml"), help="experiment YAML")
    p.add_argument("--phases", default="validation,step,checkpoint",
                   help="comma-separated, run in this order: validation, step, checkpoint")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after `--`)")
    return p.parse_args(argv)


def server_delta(server: Any, before: Any) -> dict[str, float]:
    """What the generation server did since the ``before`` copy of its stats."""
    now = server.stats
    batches = now.batches - before.batches
    sizes = now.batch_sizes[len(before.batch_sizes):]
    return {"llm_calls": now.requests - before.requests, "generated_tokens": now.generated_tokens - before.generated_tokens,
            "batches": batches, "mean_batch": round(sum(sizes) / max(len(sizes), 1), 2),
            "prefill_s": round(now.prefill_seconds - before.prefill_seconds, 1),
            "decode_s": round(now.decode_seconds - before.decode_seconds, 1),
            "decode_row_steps": now.decode_row_steps - before.decode_row_steps,
            "generate_s": round(now.generate_seconds - before.generate_seconds, 1)}


def timed(name: str, trainer: Any, fn: Any) -> dict[str, Any]:
    before = dataclasses.replace(trainer.server.stats, batch_sizes=list(trainer.server.stats.batch_sizes))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    metrics = fn() or {}
    row = {"phase": name, "seconds": round(time.perf_counter() - t0, 1), "load_before": round(load, 2),
           **server_delta(trainer.server, before)}
    row.update({k: round(float(v), 2) for k, v in metrics.items() if k.startswith("timing/")})
    for key in ("val/pass_rate", "seal/reward_mean", "actor/response_tokens"):
        if key in metrics:
            row[key] = round(float(metrics[key]), 3)
    return row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING)
    sys.stdout.reconfigure(line_buffering=True)
    import torch
    from omegaconf import open_dict

    from seal import warm_start
    from seal.config import compose_config
    from seal.trainer.local.loop import LocalTrainer

    cfg = compose_config(args.conf, [o for o in args.overrides if o != "--"])
    with open_dict(cfg):
        cfg.env_service.url = None
        cfg.env_service.urls = []
        cfg.seal.local.progress_bars = False
        cfg.seal.local.tensorboard = False
    cfg = warm_start.prepare(cfg)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, kernels "
          f"{torch.backends.cpu.get_cpu_capability()}; overrides {args.overrides}")
    phases = {"validation": lambda t: t.validate(0), "step": lambda t: t.train_step(), "checkpoint": lambda t: t.save()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trainer = LocalTrainer(cfg, Path(tmp))
        try:
            for name in args.phases.split(","):
                rows.append(timed(name, trainer, lambda: phases[name](trainer)))
                print(json.dumps(rows[-1]), flush=True)
        finally:
            trainer.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
