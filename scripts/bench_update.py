"""Update throughput of the local trainer: one full sequence per episode vs shared-prefix training.

Runs the local trainer's real update (``seal.trainer.local.update.policy_update``: reference and
old-policy log-prob passes, PPO-clip + KL loss, backward, AdamW) on real episodes of an experiment
(by default the quickstart's: SmolLM2-135M-Instruct after its warm start, the ``notes``
environment, 4 tasks x n = 4), once per mode from the same weights:

* ``rows``: each episode its own sequence (``seal.local.shared_prefix_training=false``);
* ``shared``: a GRPO group's shared stretches (its prompt, and more where its episodes agree)
  computed once, logits only where a log-prob is read (``true``).

Each batch gets two updates in a row, as steps 1 and 2 of a run: in the first the policy still
equals the reference (rows with advantage 0 are skipped, no reference pass is needed); in the
second every row trains and the reference pass runs. Prints the prompt / response token split,
seconds and tokens per second (all tokens of the batch's episodes, prompt + response, per second of
update wall time) per update and mode, their ratio, and how far the two modes' log-probs and
updated weights are apart (fp32 rounding).

The episodes are played once with the experiment's own policy and rollout settings and kept in
``--episodes`` (reused while the file exists; delete it to play new ones).

    .venv/bin/python scripts/bench_update.py
    .venv/bin/python scripts/bench_update.py --batches 2 --modes rows,shared -- seal.local.autocast=none
"""

from __future__ import annotations

import argparse
import copy
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

MODES = {"rows": False, "shared": True}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--conf", default=str(REPO / "exp" / "quickstart.yaml"), help="experiment YAML")
    p.add_argument("--episodes", default=str(REPO / ".bench" / "update_episodes.json"),
                   help="played episodes are kept here and reused while the file exists")
    p.add_argument("--batches", type=int, default=2, help="rollout batches (one step's episodes each) to update on")
    p.add_argument("--modes", default="rows,shared", help="comma-separated: rows, shared")
    p.add_argument("--repeats", type=int, default=1, help="updates per mode and batch, the modes interleaved")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after `--`)")
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> Any:
    from omegaconf import open_dict

    from seal import warm_start
    from seal.config import compose_config

    cfg = compose_config(args.conf, [o for o in args.overrides if o != "--"])
    with open_dict(cfg):
        cfg.env_service.url = None  # the environment in-process
        cfg.env_service.urls = []
        cfg.seal.local.progress_bars = False
        cfg.seal.local.tensorboard = False
    return warm_start.prepare(cfg)  # the warm-started checkpoint (trained once by install.sh)


def play_batches(cfg: Any, count: int) -> list[list[dict]]:
    """``count`` steps' worth of episodes, played by the trainer's own runner and server."""
    from seal.trainer.local.episodes import EpisodeJob
    from seal.trainer.local.loop import LocalTrainer
    from seal.trainer.step_rules import select_trainable

    n = int(cfg.actor_rollout_ref.rollout.n)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = LocalTrainer(cfg, Path(tmp))
        try:
            batches = []
            for step in range(1, count + 1):
                task_ids, epoch, _ = trainer.sampler.next_batch()
                jobs = [EpisodeJob(t, uid=f"{step}:{t}", sample=k, category=trainer.categories[t])
                        for t in task_ids for k in range(n)]
                episodes = trainer.play(jobs, train=True, epoch=epoch, desc=f"rollout {step}")
                keep = select_trainable([not e.trainable for e in episodes], [e.uid for e in episodes], n=n).trainable
                batches.append([{"uid": e.uid, "sample": e.sample, "task_id": e.task_id, "reward": e.reward,
                                 "prompt_ids": e.prompt_ids, "response_ids": e.response_ids,
                                 "response_mask": e.response_mask} for e, k in zip(episodes, keep) if k])
        finally:
            trainer.close()
    return batches


def to_batch(rows: list[dict]) -> Any:
    from seal.episode import EpisodeResult
    from seal.trainer.local.episodes import Episode
    from seal.trainer.local.update import build_batch

    return build_batch([Episode(EpisodeResult(task_id=r["task_id"], category="bench", reward=r["reward"]),
                                uid=r["uid"], sample=r["sample"], prompt_ids=r["prompt_ids"],
                                response_ids=r["response_ids"], response_mask=r["response_mask"]) for r in rows])


def token_split(batch: Any) -> dict[str, float]:
    """Prompt / response tokens, model-written tokens, and each group's shared prefix."""
    import torch

    from seal.trainer.local import prefix
    from seal.trainer.local.update import MIN_SHARED_PREFIX_TOKENS, RowForwards

    eps = batch.episodes
    forwards = RowForwards(batch, shared_prefix=True, device=torch.device("cpu"), autocast="none")
    groups = prefix.plan_groups(forwards.rows, batch.uids, range(len(eps)), MIN_SHARED_PREFIX_TOKENS)
    prompt = sum(len(e.prompt_ids) for e in eps)
    response = sum(len(e.response_ids) for e in eps)
    computed = sum(node.tokens_computed() for node in groups)
    return {"episodes": len(eps), "groups": len(groups), "prompt_tokens": prompt, "response_tokens": response,
            "model_tokens": int(batch.mask.sum()), "tokens": prompt + response,
            "mean_prompt": round(prompt / len(eps), 1), "mean_response": round(response / len(eps), 1),
            "shared_prefix_tokens_saved": prompt + response - computed, "tokens_computed_shared": computed}


def run_updates(cfg: Any, base: Any, batch: Any, shared: bool) -> tuple[list[dict], Any]:
    """Two updates in a row from ``base``'s weights; returns their timings and the final model."""
    import torch

    from seal.trainer.local.policy import LossSettings, frozen_copy
    from seal.trainer.local.update import grpo_advantages_verl, policy_update

    model = copy.deepcopy(base)
    ref = frozen_copy(model)
    o = cfg.actor_rollout_ref.actor.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(o.lr), betas=tuple(float(b) for b in o.betas),
                                  weight_decay=float(o.weight_decay))
    settings = LossSettings.from_cfg(cfg.actor_rollout_ref.actor)
    adv = grpo_advantages_verl(batch, norm_by_std=bool(cfg.algorithm.norm_adv_by_std_in_grpo))
    n = int(cfg.actor_rollout_ref.rollout.n)
    out = []
    for update in (1, 2):
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        metrics = policy_update(model, ref, optimizer, batch, adv, settings, device=torch.device("cpu"),
                                autocast=str(cfg.seal.local.autocast),
                                mini_batch_rows=int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size) * n,
                                ppo_epochs=int(cfg.actor_rollout_ref.actor.ppo_epochs),
                                grad_clip=float(cfg.actor_rollout_ref.actor.grad_clip), shared_prefix=shared)
        out.append({"update": update, "seconds": time.perf_counter() - t0, "ref_s": metrics["timing/ref_s"],
                    "skipped_rows": metrics["actor/skipped_rows"],
                    "grad_norm": metrics.get("actor/grad_norm", float("nan")), "load": load})
    return out, model


def agreement(base: Any, batch: Any, models: dict[str, Any]) -> dict[str, float]:
    """Max |difference| of the two modes' log-probs (read positions) and of their updated weights,
    the latter relative to how far the update moved the weights."""
    import torch

    from seal.trainer.local.update import RowForwards

    idx = range(len(batch.episodes))
    lp = {m: RowForwards(batch, shared_prefix=MODES[m], device=torch.device("cpu"), autocast="none").logprobs(base, idx)
          for m in ("rows", "shared")}
    logp_diff = max(float((lp["rows"][i] - lp["shared"][i])[batch.mask[i, : lp["rows"][i].shape[0]] > 0].abs().max())
                    for i in idx)
    moved = max(float((p - q).detach().abs().max()) for p, q in zip(models["rows"].parameters(), base.parameters()))
    apart = max(float((p - q).detach().abs().max())
                for p, q in zip(models["rows"].parameters(), models["shared"].parameters()))
    return {"max_logprob_diff": logp_diff, "max_weight_diff": apart, "max_weight_change": moved}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING)
    sys.stdout.reconfigure(line_buffering=True)  # each figure as soon as it is measured
    import torch

    from seal.trainer.local.policy import load_policy

    modes = args.modes.split(",")
    if any(m not in MODES for m in modes):
        print(f"bench_update: --modes {args.modes}: choose among {', '.join(MODES)}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args)
    path = Path(args.episodes)
    if path.exists():
        batches = json.loads(path.read_text())[: args.batches]
    else:
        batches = play_batches(cfg, args.batches)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(batches))
    base, _ = load_policy(cfg, torch.device("cpu"))
    print(f"model {cfg.actor_rollout_ref.model.path}; torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"kernels {torch.backends.cpu.get_cpu_capability()}, autocast {cfg.seal.local.autocast}")
    results = []
    for b, rows in enumerate(batches):
        batch = to_batch(rows)
        split = token_split(batch)
        print(f"batch {b}: {json.dumps(split)}")
        models: dict[str, Any] = {}
        for repeat in range(args.repeats):  # the modes interleaved, so a change of load hits both
            for mode in modes:
                times, model = run_updates(cfg, base, batch, MODES[mode])
                models.setdefault(mode, model)
                for t in times:
                    t.update(mode=mode, batch=b, repeat=repeat, tokens_per_s=split["tokens"] / t["seconds"])
                    print(f"  {mode:>6} update {t['update']}: {t['seconds']:6.1f} s (reference pass "
                          f"{t['ref_s']:5.1f} s), {t['tokens_per_s']:6.1f} tokens/s, {t['skipped_rows']:.0f} rows "
                          f"skipped, grad norm {t['grad_norm']:.4f}; load average {t['load']:.2f}")
                    results.append(t)
        if {"rows", "shared"} <= set(modes):
            agree = agreement(base, batch, models)
            print(f"  agreement: {json.dumps(agree)}")
            results.append({"batch": b, **split, **agree})
    summarize([r for r in results if "mode" in r], modes)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def summarize(times: list[dict], modes: list[str]) -> None:
    """Median tokens/s per mode and update over batches and repeats, and their ratio."""
    import statistics

    for update in (1, 2):
        med = {m: statistics.median(t["tokens_per_s"] for t in times if t["mode"] == m and t["update"] == update)
               for m in modes}
        line = ", ".join(f"{m} {v:.1f} tokens/s" for m, v in med.items())
        ratio = f"; shared / rows = {med['shared'] / med['rows']:.2f}x" if {"rows", "shared"} <= set(med) else ""
        print(f"update {update} (median of {len(times) // (2 * len(modes))}): {line}{ratio}")


if __name__ == "__main__":
    raise SystemExit(main())
