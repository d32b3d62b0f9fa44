"""Speculative decoding: the quickstart's episodes with and without prompt-lookup speculation.

Builds the experiment's :class:`~seal.trainer.local.loop.LocalTrainer` (by default the quickstart's:
the warm-started SmolLM2-135M-Instruct on ``notes``, environment in-process, generation batches of
32) in a scratch folder and plays, through the trainer's own episode runner and generation server:

* ``rollout``: the first training step's episodes (4 tasks x n = 4, sampled at the rollout's
  temperature), no update;
* ``validation``: one greedy episode per validation task (30).

Each phase runs once per mode (``off``, then ``on``; ``--repeats`` alternates more), each from an
empty key/value cache. Speculation is exact, and a seeded sampled call draws the same tokens either
way; a sampled call the runner sends unseeded (the local trainer's do) gets a seed from a digest
of its prompt here (``--no-seed-requests``: leave them unseeded), so the episodes must come out the
same: the script compares every episode's tokens with the first ``off`` run's and names those that
differ. Some may, in either mode: a near-tie flipped by float rounding, which depends on the
batch's shape (under bf16 autocast often enough that two ``off`` runs differ too; in fp32 rarely).
Prints, per phase and mode: generated tokens, wall and decode seconds, tokens per second of wall
time (episodes included) and of decode time, decode forwards, drafted and accepted tokens; then
the speed-ups.

    .venv/bin/python scripts/bench_speculative.py
    .venv/bin/python scripts/bench_speculative.py --phases rollout --repeats 2 --dtype fp32
    .venv/bin/python scripts/bench_speculative.py --max-draft 4 -- seal.local.generation_batch_size=8
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
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

log = logging.getLogger("bench_speculative")
PHASES = ("rollout", "validation")
DTYPES = {"auto": "auto", "fp32": "none", "bf16": "bf16"}  # --dtype -> seal.local.autocast


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--conf", default=str(REPO / "exp" / "quickstart.yaml"), help="experiment YAML")
    p.add_argument("--phases", default="rollout,validation", help=f"comma-separated: {', '.join(PHASES)}")
    p.add_argument("--repeats", type=int, default=1, help="runs per mode and phase (off and on alternate)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="auto",
                   help="generation precision: auto (seal.local.autocast=auto: bf16 where the CPU runs it "
                        "natively), fp32, bf16")
    p.add_argument("--max-draft", type=int, default=None, help="seal.local.speculative.max_draft (default: config's)")
    p.add_argument("--ngram", type=int, default=None, help="seal.local.speculative.ngram (default: config's)")
    p.add_argument("--max-val-tasks", type=int, default=None, help="validate on the first N validation tasks only")
    p.add_argument("--no-seed-requests", action="store_true",
                   help="leave unseeded sampled calls unseeded (their episodes then differ between runs)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any episode differs between the modes")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after `--`)")
    return p.parse_args(argv)


def cpu_line() -> str:
    """The CPU's model name, its AVX-512 / AMX support and torch's kernel level."""
    import torch

    from seal.engine import precision

    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = precision.cpu_flags() or set()
    has = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return (f"{name}, {os.cpu_count()} cpus, {', '.join(has) or 'no AVX-512'}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, kernels {torch.backends.cpu.get_cpu_capability()}")


def build_trainer(args: argparse.Namespace, tmp: Path) -> Any:
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
        cfg.seal.local.autocast = DTYPES[args.dtype]
        if args.max_val_tasks is not None:
            cfg.seal.tasks.max_val_tasks = args.max_val_tasks
    cfg = warm_start.prepare(cfg)
    log.info("model %s", cfg.actor_rollout_ref.model.path)
    return LocalTrainer(cfg, tmp), cfg


def seed_requests(server: Any) -> None:
    """Give every unseeded sampled call a seed from a digest of its prompt: the same call in
    either mode (an identical episode so far) then draws from the same stream."""
    plain = server.generate

    async def generate(request_id: str, prompt_ids: Any, sampling_params: Any, **kwargs: Any) -> Any:
        params = dict(sampling_params)
        if float(params.get("temperature", 1.0)) > 0 and params.get("seed") is None:
            digest = hashlib.blake2b(",".join(map(str, prompt_ids)).encode(), digest_size=8).digest()
            params["seed"] = int.from_bytes(digest, "little") % (2**63)
        return await plain(request_id, prompt_ids, params, **kwargs)

    server.generate = generate


def settings_for(args: argparse.Namespace, cfg: Any, enable: bool) -> Any:
    from seal.engine.speculative import SpeculativeSettings

    base = SpeculativeSettings.from_config(cfg)
    return dataclasses.replace(base, enable=enable,
                               max_draft=args.max_draft if args.max_draft is not None else base.max_draft,
                               ngram=args.ngram if args.ngram is not None else base.ngram)


def phase_jobs(trainer: Any, phase: str) -> tuple[list[Any], bool]:
    """The phase's episodes (the same list for every run) and whether they train (sampled)."""
    from seal.trainer.local.episodes import EpisodeJob

    if phase == "rollout":
        task_ids, _, _ = trainer.sampler.next_batch()
        n = int(trainer.rollout_cfg.n)
        return [EpisodeJob(t, uid=f"1:{t}", sample=k, category=trainer.categories[t])
                for t in task_ids for k in range(n)], True
    return [EpisodeJob(t, uid=t, sample=0, category=trainer.categories[t]) for t in trainer.val_ids], False


def run_once(trainer: Any, jobs: list[Any], train: bool, settings: Any, label: str) -> tuple[dict, list]:
    """Play ``jobs`` from an empty cache under ``settings``; the figures and each episode's tokens."""
    server = trainer.server
    server.speculative = settings
    server.clear_cache()
    before = dataclasses.replace(server.stats, batch_sizes=list(server.stats.batch_sizes))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    episodes = trainer.play(jobs, train=train, epoch=0, desc=label)
    wall = time.perf_counter() - t0
    now = server.stats
    d = {f: getattr(now, f) - getattr(before, f) for f in ("requests", "generated_tokens", "generate_seconds",
         "prefill_seconds", "decode_seconds", "decode_steps", "decode_row_steps", "drafted_tokens",
         "accepted_tokens")}
    tokens = d["generated_tokens"]
    row = {"run": label, "speculative": settings.enable, "episodes": len(episodes), "llm_calls": d["requests"],
           "generated_tokens": tokens, "wall_s": round(wall, 1), "prefill_s": round(d["prefill_seconds"], 1),
           "decode_s": round(d["decode_seconds"], 1), "tokens_per_s": round(tokens / wall, 2),
           "decode_tokens_per_s": round(tokens / max(d["decode_seconds"], 1e-9), 2),
           "decode_steps": d["decode_steps"], "row_steps": d["decode_row_steps"],
           "drafted": d["drafted_tokens"], "accepted": d["accepted_tokens"],
           "acceptance_rate": round(d["accepted_tokens"] / max(d["drafted_tokens"], 1), 3),
           "accepted_per_row_step": round(d["accepted_tokens"] / max(d["decode_row_steps"], 1), 3),
           "faults": sum(bool(e.env_fault or e.llm_fault) for e in episodes),
           "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}
    return row, [(e.uid, e.sample, list(e.response_ids)) for e in episodes]


def compare(reference: list, other: list) -> list[str]:
    """The episodes whose tokens differ, each with where they part."""
    diffs = []
    for (uid, k, a), (_, _, b) in zip(reference, other):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diffs.append(f"{uid}#{k} (token {at} of {len(a)} / {len(b)})")
    return diffs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("seal").setLevel(logging.WARNING)
    sys.stdout.reconfigure(line_buffering=True)
    unknown = [p for p in args.phases.split(",") if p not in PHASES]
    if unknown or args.repeats < 1:
        print(f"bench_speculative: bad --phases {args.phases!r} or --repeats {args.repeats}", file=sys.stderr)
        return 2
    log.info("%s", cpu_line())
    log.info("load average before: %s", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    rows, summary, mismatched = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        trainer, cfg = build_trainer(args, Path(tmp))
        if not args.no_seed_requests:
            seed_requests(trainer.server)
        try:
            for phase in args.phases.split(","):
                jobs, train = phase_jobs(trainer, phase)
                runs: dict[bool, list[dict]] = {False: [], True: []}
                outputs: dict[bool, list] = {}
                for r in range(args.repeats):
                    for enable in (False, True):
                        label = f"{phase} {'on' if enable else 'off'} #{r + 1}"
                        log.info("%s: %d episodes ...", label, len(jobs))
                        row, tokens = run_once(trainer, jobs, train, settings_for(args, cfg, enable), label)
                        rows.append(row)
                        runs[enable].append(row)
                        print(json.dumps(row))
                        diffs = compare(outputs.setdefault(False, tokens), tokens)
                        if diffs:
                            mismatched += len(diffs)
                            log.warning("%s: %d of %d episodes differ from the first 'off' run: %s", label,
                                        len(diffs), len(jobs), ", ".join(diffs[:5]))
                summary.append(summarise(phase, runs))
                print(summary[-1]["line"])
        finally:
            trainer.close()
    log.info("load average after: %s", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cpu": cpu_line(), "runs": rows,
                                               "summary": summary}, indent=2))
    return 1 if args.strict and mismatched else 0


def summarise(phase: str, runs: dict[bool, list[dict]]) -> dict[str, Any]:
    """Best-of-repeats tokens/s each way (the least disturbed run on a shared CPU) and the speed-ups."""
    off = max(runs[False], key=lambda r: r["tokens_per_s"])
    on = max(runs[True], key=lambda r: r["tokens_per_s"])
    speedup = on["tokens_per_s"] / max(off["tokens_per_s"], 1e-9)
    decode = on["decode_tokens_per_s"] / max(off["decode_tokens_per_s"], 1e-9)
    line = (f"{phase}: off {off['tokens_per_s']:.1f} tok/s | on {on['tokens_per_s']:.1f} tok/s | speed-up "
            f"{speedup:.2f}x (decode only {off['decode_tokens_per_s']:.1f} -> {on['decode_tokens_per_s']:.1f} tok/s, "
            f"{decode:.2f}x) | acceptance {on['acceptance_rate']:.1%} ({on['accepted']}/{on['drafted']}) | "
            f"accepted per row-step {on['accepted_per_row_step']:.2f} | forwards {off['decode_steps']} -> "
            f"{on['decode_steps']}")
    return {"phase": phase, "speedup": round(speedup, 3), "decode_speedup": round(decode, 3), "line": line}


if __name__ == "__main__":
    raise SystemExit(main())
