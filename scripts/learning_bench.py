"""Does the recipe learn? Runs an experiment over several seeds (and variants) and reports learning.

    python scripts/learning_bench.py --conf exp/quickstart.yaml --seeds 0 1 2
    python scripts/learning_bench.py --conf exp/quickstart.yaml --seeds 0 1 2 --variants seal vanilla

Each (variant, seed) is one ``launcher.py`` run in a subprocess (``data.seed=<seed>``, its own
``trainer.experiment_name``, ``trainer.resume_mode=disable``). Printed per run and as mean ± std
over seeds: the training reward of every step, the held-out validation pass rate before the first
step and after the last, the optimizer updates performed, and wall time. With two variants, the
difference of the held-out pass rate after training (the second variant minus the first) is
reported with a 95 % t-interval over seeds and a paired bootstrap interval over (seed, task).

Variants: ``seal`` (the config as it is) and ``vanilla`` (the switches of
exp/ablations/vanilla_rl.yaml: ``seal.enable=false`` and the environment's ``observation_lite``
off; the reward mode stays the recipe's, so only SEAL's parts differ). ``NAME=k=v,k=v`` defines
another. Every variant starts where the config's own recipe starts: with a warm start, that checkpoint
(trained here first if it is not there yet) and the RL tasks it leaves, whatever the variants and
their order (:func:`recipe_start`). Writes ``<out>/summary.json``, ``<out>/learning.png`` and each run's log.

``--final``: after the runs, the final evaluation on the held-out ``test`` split, which nothing
else reads (:mod:`final_test`): the starting policy and every run's last checkpoint, greedy and
sampled; RL's gain per variant, and the second variant minus the first, with intervals from a
bootstrap over tasks, seeds and episodes that carries the shared baseline's noise. With
``--no-validation`` the runs skip their own ``val`` validations (the final evaluation is then the
only held-out measurement, and each run is minutes shorter).

``--share-before``: the validation before the first step runs once, in the first run; the others
skip it (``trainer.val_before_train=false``) and are compared with it. Every run starts from the
same weights, and validation never applies the training interface (``apply_to_validation: false``),
so their before-validations would measure one policy again: on the short notes benchmark that is
about 7 of each run's 17 minutes. The runs' gains then share one baseline, so they are not
independent across seeds; the greedy baseline is deterministic up to batching, the sampled one
is a single draw.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass
class RunResult:
    """What one (variant, seed) run showed."""

    variant: str
    seed: int
    rewards: list[float] = field(default_factory=list)
    # Per step: the fraction of the step's episodes whose advantage is non-zero (the rest sit in
    # GRPO groups whose episodes all scored the same, and give no policy gradient).
    signal: list[float] = field(default_factory=list)
    # The KL-loss term at the last step: how far the policy has moved from the warm start.
    kl_last: float | None = None
    updates: int = 0
    skipped_updates: int = 0
    val_before: float | None = None
    val_after: float | None = None
    val_scores_before: dict[str, float] = field(default_factory=dict)
    val_scores_after: dict[str, float] = field(default_factory=dict)
    # With seal.local.sampled_validation_n: each task's pass fraction over its sampled episodes.
    sampled_before: dict[str, float] = field(default_factory=dict)
    sampled_after: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    returncode: int = 0


def vanilla_overrides(env: str) -> list[str]:
    """The switches of exp/ablations/vanilla_rl.yaml, for the config's environment (its reward
    mode is left out: the comparison keeps the recipe's reward)."""
    return ["seal.enable=false", f"env_service.{env}.observation_lite.enable=false"]


def variant_overrides(spec: str, env: str) -> tuple[str, list[str]]:
    if spec == "seal":
        return "seal", []
    if spec == "vanilla":
        return "vanilla", vanilla_overrides(env)
    name, sep, rest = spec.partition("=")
    if not sep or not name.isidentifier():
        raise SystemExit(f"learning_bench: --variants {spec!r}: use seal, vanilla or NAME=key=value,key=value")
    return name, [kv for kv in rest.split(",") if kv]


def read_run(exp_dir: Path, variant: str, seed: int) -> RunResult:
    """Per-step metrics and the validation logs of a finished run."""
    res = RunResult(variant, seed)
    metrics = [json.loads(line) for line in (exp_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    for m in metrics:
        if "val/pass_rate" in m:
            if m["step"] == 0:
                res.val_before = float(m["val/pass_rate"])
            res.val_after = float(m["val/pass_rate"])
        if m["step"] >= 1 and "seal/reward_mean" in m:
            res.rewards.append(float(m["seal/reward_mean"]))
            episodes = float(m.get("seal/trained_episodes") or 0)
            if episodes and "actor/advantage_rows" in m:
                res.signal.append(float(m["actor/advantage_rows"]) / episodes)
            elif episodes:  # runs from before that metric: the rows left out of the update, which
                # are the zero-advantage ones only while the policy still equals the reference
                res.signal.append(1.0 - float(m.get("actor/skipped_rows", 0)) / episodes)
            if "actor/kl_loss" in m:
                res.kl_last = float(m["actor/kl_loss"])
            done = int(m.get("actor/num_updates", 0)) - int(m.get("actor/skipped_updates", 0))
            res.updates += done
            res.skipped_updates += int(m.get("actor/skipped_updates", 0)) + (0 if "actor/num_updates" in m else 1)
    res.val_scores_before, res.val_scores_after = first_and_last_scores(exp_dir / "validation_log")
    res.sampled_before, res.sampled_after = first_and_last_scores(exp_dir / "validation_log_sampled")
    return res


def with_baseline(run: RunResult, baseline: RunResult) -> RunResult:
    """``run`` with ``baseline``'s before-figures where it has none of its own (it skipped its
    validation before training)."""
    if run.returncode == 0 and run.val_before is None:
        run.val_before = baseline.val_before
        run.val_scores_before = dict(baseline.val_scores_before)
        run.sampled_before = dict(baseline.sampled_before)
    return run


def first_and_last_scores(log_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Each task's mean score (pass = 1) in the validation log before the first step (``0.jsonl``)
    and in the last one after a step; each empty when there is none."""
    logs = sorted(log_dir.glob("*.jsonl"), key=lambda p: int(p.stem))

    def scores(path: Path) -> dict[str, float]:
        by_task: dict[str, list[float]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                by_task.setdefault(row["task_id"], []).append(float(row["score"]))
        return {t: statistics.fmean(v) for t, v in by_task.items()}

    before = scores(logs[0]) if logs and int(logs[0].stem) == 0 else {}
    after = scores(logs[-1]) if logs and int(logs[-1].stem) > 0 else {}
    return before, after


def recipe_start(conf: str, overrides: list[str]) -> list[str]:
    """Overrides that start every variant from the config's own warm start, when it has one: its
    checkpoint (fine-tuned now, in this process, unless it exists) and its RL tasks, with the
    warm start itself off. Without them a variant that changes the training interface (vanilla
    turns the schema hints off) would fine-tune its own warm start on other transcripts, and the
    comparison would mix the two."""
    from seal import warm_start
    from seal.config import compose_config
    from seal.trainer.tasks import select_task_ids

    cfg = compose_config(conf, overrides)
    if not cfg.seal.warm_start.enable:
        return []
    ids = ",".join(select_task_ids(cfg, "train"))
    ready = warm_start.prepare(cfg)
    return ["seal.warm_start.enable=false", f"actor_rollout_ref.model.path={ready.actor_rollout_ref.model.path}",
            f"seal.tasks.train_ids=[{ids}]"]


def run_name(conf: str, variant: str, seed: int) -> str:
    return f"learnbench_{Path(conf).stem}_{variant}_s{seed}"


def finished(exp_dir: Path) -> bool:
    """Whether a run finished: it wrote its final validation (the last line of metrics.jsonl has
    val/*), or, run without validations, its last step's checkpoint."""
    try:
        lines = [line for line in (exp_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except OSError:
        return False
    if not lines or json.loads(lines[-1])["step"] <= 0:
        return False
    return "val/pass_rate" in json.loads(lines[-1]) or last_checkpoint(exp_dir) == json.loads(lines[-1])["step"]


def last_checkpoint(exp_dir: Path) -> int | None:
    """The step of a run's newest checkpoint (``latest_checkpointed_iteration.txt``), if any."""
    marker = exp_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    return int(marker.read_text().strip()) if marker.is_file() else None


def logged_wall_s(log: Path) -> float:
    """Seconds between the first and the last timestamped line of a run's log (0 when unknown)."""
    import datetime as dt

    stamps = []
    try:
        for line in log.read_text(errors="replace").splitlines():
            try:
                stamps.append(dt.datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            except ValueError:
                continue
    except OSError:
        return 0.0
    return (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else 0.0


def run_one(conf: str, variant: str, extra: list[str], seed: int, out: Path, overrides: list[str], *,
            reuse: bool = False) -> RunResult:
    name = run_name(conf, variant, seed)
    if reuse and finished(ROOT / "experiments" / name):
        print(f"[learning_bench] {variant} seed {seed}: reusing experiments/{name}", flush=True)
        res = read_run(ROOT / "experiments" / name, variant, seed)
        res.wall_s = logged_wall_s(out / f"{name}.log")
        return res
    cmd = [sys.executable, str(ROOT / "launcher.py"), "--conf", conf, "--", *overrides, *extra,
           f"data.seed={seed}", f"trainer.experiment_name={name}", "trainer.resume_mode=disable",
           "seal.local.progress_bars=false"]
    log = out / f"{name}.log"
    print(f"[learning_bench] {variant} seed {seed}: {' '.join(cmd[1:])} (log: {log})", flush=True)
    t0 = time.time()
    with log.open("w") as f:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.time() - t0
    if rc != 0:
        print(f"[learning_bench] {variant} seed {seed} failed (exit {rc}); see {log}", flush=True)
        return RunResult(variant, seed, wall_s=wall, returncode=rc)
    res = read_run(ROOT / "experiments" / name, variant, seed)
    res.wall_s = wall
    return res


def flips(run: RunResult) -> tuple[int, int]:
    """Held-out tasks the greedy policy passes after training and failed before, and the reverse:
    RL that only adds noise moves about as many tasks each way."""
    before, after = run.val_scores_before, run.val_scores_after
    shared = [t for t in before if t in after]
    return (sum(after[t] > before[t] for t in shared), sum(after[t] < before[t] for t in shared))


def mean_std(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f}"


def t_interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % t-interval over seeds; the bounds are NaN with one seed (see :func:`span`)."""
    m = statistics.mean(diffs)
    if len(diffs) < 2:
        return m, float("nan"), float("nan")
    half = T_975.get(len(diffs) - 1, 1.96) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return m, m - half, m + half


def span(lo: float, hi: float, seeds: int) -> str:
    """``[lo, hi]`` as printed, or why there is no interval (a t-interval needs two seeds)."""
    if math.isnan(lo) or math.isnan(hi):
        return f"n/a ({seeds} seed{'s' if seeds != 1 else ''})"
    return f"[{lo:+.3f}, {hi:+.3f}]"


def paired_bootstrap(a: list[RunResult], b: list[RunResult], *, sampled: bool = False,
                     resamples: int = 10000) -> tuple[float, float]:
    """95 % interval of mean(after score of b − a) over (seed, task) pairs, resampled with
    replacement; ``sampled``: each task's pass fraction over its sampled episodes."""
    pairs = []
    for ra, rb in zip(a, b):
        pairs += paired_diffs(ra, rb, sampled=sampled)
    return bootstrap_mean(pairs, resamples=resamples)


def paired_diffs(ra: RunResult, rb: RunResult, *, sampled: bool) -> list[float]:
    """Per task, ``rb``'s score after training minus ``ra``'s (greedy, or the sampled fraction)."""
    sa, sb = (ra.sampled_after, rb.sampled_after) if sampled else (ra.val_scores_after, rb.val_scores_after)
    return [sb[t] - sa[t] for t in sa if t in sb]


def rl_gain(runs: list[RunResult], *, sampled: bool) -> dict | None:
    """RL's own held-out change, after the last step minus before the first (the warm-started
    policy): its mean over (seed, task), a 95 % t-interval over seeds and a bootstrap interval
    over (seed, task) pairs. ``sampled``: the sampled validation's per-task pass fractions."""
    per_seed, pairs = [], []
    for r in runs:
        before, after = (r.sampled_before, r.sampled_after) if sampled else (r.val_scores_before, r.val_scores_after)
        diffs = [after[t] - before[t] for t in before if t in after]
        if diffs:
            per_seed.append(statistics.fmean(diffs))
            pairs += diffs
    if not pairs:
        return None
    m, lo, hi = t_interval(per_seed)
    blo, bhi = bootstrap_mean(pairs)
    return {"mean": statistics.fmean(pairs), "per_seed": per_seed, "t95": [lo, hi], "bootstrap95": [blo, bhi],
            "pairs": len(pairs)}


def bootstrap_mean(pairs: list[float], *, resamples: int = 10000) -> tuple[float, float]:
    """95 % percentile interval of the mean of ``pairs``, resampled with replacement (seeded)."""
    if not pairs:
        return float("nan"), float("nan")
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(pairs, k=len(pairs))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def report(results: dict[str, list[RunResult]]) -> dict:
    summary: dict = {"variants": {}}
    for variant, runs in results.items():
        print(f"\n== {variant}: {len(runs)} seeds")
        for r in runs:
            rw = " ".join(f"{x:.2f}" for x in r.rewards)
            sig = " ".join(f"{x:.2f}" for x in r.signal)
            won, lost = flips(r)
            print(f"seed {r.seed}: reward per step [{rw}] | episodes with a non-zero advantage [{sig}] | "
                  f"val {r.val_before} -> {r.val_after} (greedy: {won} tasks newly passed, {lost} newly failed) | "
                  f"updates {r.updates} (skipped {r.skipped_updates}) | KL at the last step {r.kl_last} | "
                  f"{r.wall_s / 60:.1f} min")
        steps = max((len(r.rewards) for r in runs), default=0)
        per_step = [mean_std([r.rewards[i] for r in runs if i < len(r.rewards)]) for i in range(steps)]
        print("reward per step (mean ± std over seeds): " + " | ".join(per_step))
        gains = [r.val_after - r.val_before for r in runs if r.val_after is not None and r.val_before is not None]
        first_last = [r.rewards[-1] - r.rewards[0] for r in runs if len(r.rewards) > 1]
        print(f"val before {mean_std([r.val_before for r in runs])}, after {mean_std([r.val_after for r in runs])}, "
              f"gain {mean_std(gains)}; reward last - first step {mean_std(first_last)}; "
              f"updates {mean_std([float(r.updates) for r in runs])}; wall {mean_std([r.wall_s / 60 for r in runs])} min")
        summary["variants"][variant] = [asdict(r) for r in runs]
        for sampled, label in ((False, "greedy"), (True, "sampled")):
            gain = rl_gain(runs, sampled=sampled)
            if gain is not None:
                print(f"RL's held-out gain ({label}, after - before): {gain['mean']:+.3f} over {gain['pairs']} "
                      f"(seed, task) pairs; 95% t-interval over seeds {span(*gain['t95'], len(gain['per_seed']))}; "
                      f"bootstrap over seed x task [{gain['bootstrap95'][0]:+.3f}, {gain['bootstrap95'][1]:+.3f}]")
                summary.setdefault("rl_gain", {}).setdefault(variant, {})[label] = gain
    names = list(results)
    if len(names) == 2:
        difference(names, *(sorted(results[n], key=lambda r: r.seed) for n in names), summary)
    return summary


def difference(names: list[str], a: list[RunResult], b: list[RunResult], summary: dict) -> None:
    """The second variant minus the first after training: the greedy pass rate (t-interval over
    seeds, paired bootstrap over seed x task), and the sampled pass fraction where it was measured."""
    greedy = [rb.val_after - ra.val_after for ra, rb in zip(a, b) if None not in (ra.val_after, rb.val_after)]
    sampled = [statistics.fmean(d) for d in (paired_diffs(ra, rb, sampled=True) for ra, rb in zip(a, b)) if d]
    for per_seed, is_sampled, what, key in ((greedy, False, "\n", "difference"),
                                            (sampled, True, "", "difference_sampled")):
        if not per_seed:
            continue
        m, lo, hi = t_interval(per_seed)
        blo, bhi = paired_bootstrap(a, b, sampled=is_sampled)
        label = "sampled held-out pass fraction" if is_sampled else "held-out pass rate"
        print(f"{what}{names[1]} - {names[0]}, {label} after training: {m:+.3f} "
              f"(95% t-interval over {len(per_seed)} seeds {span(lo, hi, len(per_seed))}; paired bootstrap over "
              f"seed x task [{blo:+.3f}, {bhi:+.3f}])")
        summary[key] = {"of": f"{names[1]} - {names[0]}", "mean": m, "t95": [lo, hi],
                        "bootstrap95": [blo, bhi], "per_seed": per_seed}


def final_report(args: argparse.Namespace, overrides: list[str], start: list[str],
                 results: dict[str, list[RunResult]], out: Path) -> dict:
    """The final evaluation on ``test`` (:mod:`final_test`) and its figures, printed and returned."""
    import final_test as ft
    from seal.config import compose_config

    cfg = compose_config(args.conf, overrides + start)
    base = Path(str(cfg.actor_rollout_ref.model.path))
    before = ft.evaluate_policy(base, args.conf, out / "final_test" / "start", repeats=args.final_before_repeats,
                                seed=0, overrides=overrides)
    after: dict[str, list[ft.PolicyScores]] = {}
    for variant, runs in results.items():
        for r in runs:
            exp_dir = ROOT / "experiments" / run_name(args.conf, variant, r.seed)
            step = last_checkpoint(exp_dir)
            if step is None:
                raise SystemExit(f"learning_bench --final: {exp_dir} has no checkpoint")
            model = ft.export_hf(exp_dir / "checkpoints" / f"global_step_{step}", base, exp_dir / "final_hf")
            after.setdefault(variant, []).append(ft.evaluate_policy(
                model, args.conf, out / "final_test" / f"{variant}_s{r.seed}", repeats=args.final_repeats,
                seed=r.seed + 1, overrides=overrides))
    labels = ("greedy", "sampled") if before.sampled and args.final_repeats > 0 else ("greedy",)
    report: dict = {"start": {label: statistics.fmean(statistics.fmean(v) for v in ft_cells(before, label).values())
                              for label in labels}}
    print(f"\n== final evaluation on test ({len(before.greedy)} tasks): starting policy "
          + ", ".join(f"{label} {value:.3f}" for label, value in report["start"].items()))
    for variant, scores in after.items():
        for label in labels:
            cells = [ft_cells(s, label) for s in scores]
            gain = ft.clustered_interval(cells, before=ft_cells(before, label))
            report.setdefault(variant, {})[label] = gain
            print(f"{variant}: RL's gain on test ({label}): {gain['mean']:+.3f} [{gain['ci95'][0]:+.3f}, "
                  f"{gain['ci95'][1]:+.3f}] over {gain['seeds']} seeds x {gain['tasks']} tasks "
                  f"(per seed {' '.join(f'{x:+.3f}' for x in gain['per_seed'])})")
    names = list(after)
    if len(names) == 2:
        for label in labels:
            diff = ft.clustered_interval([ft_cells(s, label) for s in after[names[1]]],
                                         minus=[ft_cells(s, label) for s in after[names[0]]])
            report[f"{names[1]} - {names[0]}"] = report.get(f"{names[1]} - {names[0]}", {}) | {label: diff}
            print(f"{names[1]} - {names[0]} on test ({label}): {diff['mean']:+.3f} "
                  f"[{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]")
    return report


def ft_cells(scores, label: str) -> dict[str, list[float]]:
    """A policy's test scores as cells of episodes: the greedy score alone, or the sampled ones."""
    return {t: [v] for t, v in scores.greedy.items()} if label == "greedy" else scores.sampled


def plot(results: dict[str, list[RunResult]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for (variant, runs), color in zip(results.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        for r in runs:
            ax1.plot(range(1, len(r.rewards) + 1), r.rewards, color=color, alpha=0.3)
            ax2.plot([0, 1], [r.val_before, r.val_after], color=color, alpha=0.3, marker="o")
        steps = max((len(r.rewards) for r in runs), default=0)
        mean = [statistics.mean([r.rewards[i] for r in runs if i < len(r.rewards)]) for i in range(steps)]
        ax1.plot(range(1, steps + 1), mean, color=color, linewidth=2.5, label=f"{variant} (mean of {len(runs)})")
        ok = [r for r in runs if r.val_after is not None]
        if ok:
            ax2.plot([0, 1], [statistics.mean([r.val_before for r in ok]), statistics.mean([r.val_after for r in ok])],
                     color=color, linewidth=2.5, marker="o", label=variant)
    ax1.set(xlabel="training step", ylabel="mean training reward", title="training reward")
    ax2.set(xticks=[0, 1], xticklabels=["before", "after"], ylabel="pass rate", title="held-out validation")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conf", default="exp/quickstart.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=["seal"],
                    help="seal, vanilla, or NAME=key=value,key=value (with two, their difference is reported)")
    ap.add_argument("--out", default=".bench/learning", help="logs, summary.json and learning.png")
    ap.add_argument("--share-before", action="store_true",
                    help="validate before training in the first run only; the others are compared with it")
    ap.add_argument("--final", action="store_true",
                    help="then evaluate the starting policy and every run's last checkpoint on the held-out test "
                         "split (the one read of it), greedy and sampled, and report RL's gain on it")
    ap.add_argument("--final-repeats", type=int, default=1,
                    help="sampled episodes per test task for each trained run (default %(default)s; 0 = greedy only)")
    ap.add_argument("--final-before-repeats", type=int, default=2,
                    help="sampled episodes per test task for the starting policy (default %(default)s)")
    ap.add_argument("--no-validation", action="store_true",
                    help="the runs skip their own validations on val (with --final: test is the measurement)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the figures of runs that already finished (their experiments/ folder) instead of rerunning")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not (ROOT / args.conf).is_file() and not Path(args.conf).is_file():
        print(f"learning_bench: --conf {args.conf}: no such file", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    from seal.config import compose_config
    from seal.environment import environment_name

    env = environment_name(compose_config(args.conf, overrides))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[RunResult]] = {}
    start = recipe_start(args.conf, overrides)
    if args.no_validation:
        start += ["trainer.val_before_train=false", "trainer.test_freq=0"]
    for spec in args.variants:
        name, extra = variant_overrides(spec, env)
        extra = start + extra
        results[name] = []
        for seed in args.seeds:
            baseline = next((r for runs in results.values() for r in runs), None) if args.share_before else None
            skip = ["trainer.val_before_train=false"] if baseline is not None else []
            run = run_one(args.conf, name, extra + skip, seed, out, overrides, reuse=args.reuse)
            results[name].append(with_baseline(run, baseline) if baseline is not None else run)
    failed = [r for runs in results.values() for r in runs if r.returncode != 0]
    results = {k: [r for r in v if r.returncode == 0] for k, v in results.items()}
    summary = report(results)
    if args.final:
        summary["final_test"] = final_report(args, overrides, start, results, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(results, out / "learning.png")
    print(f"\nwrote {out / 'summary.json'} and {out / 'learning.png'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
