"""The ``seal`` console script.

    seal eval --model models/SmolLM2-135M-Instruct --split val --limit 8 --out experiments/eval_smol
    seal eval --endpoint http://127.0.0.1:8000/v1 --served-model Qwen2.5-7B-Instruct --split eval
    seal export-bfcl --log experiments/eval_smol/validation_log/0.jsonl --out .bench/bfcl-results
    seal config --show

``python -m seal.eval`` runs the ``eval`` subcommand directly.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable


DEFAULT_BUDGET_CONF = Path(__file__).resolve().parents[1] / "exp" / "SEAL.yaml"


def protocol_from_args(args: argparse.Namespace, user_params: dict[str, Any]) -> tuple[Any, str, dict[str, Any]]:
    """What ``--conf`` (with ``--set`` overrides) fixes of the evaluation, as the trainers' validation
    reads it: the episode budget (:class:`RolloutSettings`), the environment (``env_service.env``)
    and each episode's ``/create`` params (its block in ``validate`` mode, ``--params`` on top)."""
    from seal.config import ConfigError, compose_config
    from seal.environment import environment_name, episode_params
    from seal.rollout.settings import RolloutSettings

    try:
        cfg = compose_config(args.conf, list(args.conf_overrides), check=False)
        return (RolloutSettings.from_config(cfg), environment_name(cfg),
                episode_params(cfg, "validate", user_params))
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"seal eval: --conf {args.conf}: {exc}") from None


def add_eval_arguments(ap: argparse.ArgumentParser) -> None:
    src = ap.add_argument_group("policy (exactly one of --model / --endpoint)")
    src.add_argument("--model", help="local Hugging Face checkpoint directory")
    src.add_argument("--endpoint", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1")
    src.add_argument("--served-model", help="model name to send to --endpoint")
    src.add_argument("--api-key-env", default="OPENAI_API_KEY",
                     help="environment variable holding the endpoint's API key (default %(default)s)")
    src.add_argument("--device", default="cpu",
                     help="--model device: cpu (on GPUs, serve the model with vLLM and use --endpoint)")
    src.add_argument("--dtype", default="auto", help="--model dtype: auto, float32, bfloat16, float16")
    src.add_argument("--batch-size", type=int, default=8, help="--model: max requests per generate")
    src.add_argument("--batch-tokens", type=int, default=16384,
                     help="--model: max padded prompt tokens per generate (default %(default)s)")
    src.add_argument("--prefix-cache-tokens", type=int, default=None,
                     help="--model: key/value positions kept for reuse across calls, so a call only "
                          "prefills its new messages (default: the engine's 65536; 0 = no reuse)")

    tasks = ap.add_argument_group("tasks")
    tasks.add_argument("--split", default="val", choices=["train", "val", "test", "eval"])
    tasks.add_argument("--tasks", help="comma-separated task ids (overrides --split)")
    tasks.add_argument("--categories", help="comma-separated categories to keep")
    tasks.add_argument("--per-category", type=int, help="keep the first N tasks of each category")
    tasks.add_argument("--limit", type=int, help="evaluate at most N tasks")
    tasks.add_argument("--max-prompt-tokens", type=int,
                       help="skip tasks whose initial prompt is longer (needs --model's tokenizer)")

    gen = ap.add_argument_group("generation (validation defaults: greedy, one sample)")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--max-new-tokens", type=int, default=None,
                     help="new tokens per LLM call (default: the budget's, seal.rollout.max_tokens_per_call "
                          "or actor_rollout_ref.rollout.response_length of --conf)")
    gen.add_argument("--max-llm-calls", type=int, default=None,
                     help="LLM calls per episode (default: the budget's, seal.rollout.max_llm_calls of --conf)")

    budget = ap.add_argument_group("evaluation protocol (the trainers' validation, read from the same config keys)")
    budget.add_argument("--conf", type=Path, default=DEFAULT_BUDGET_CONF,
                        help="experiment config whose validation protocol applies: the episode budget "
                             "(seal.rollout.{episode_budget, max_llm_calls, max_env_tokens, max_tokens_per_call, "
                             "few_shot}, actor_rollout_ref.rollout.{max_model_len, response_length}), the "
                             "environment (env_service.env) and its episode params (env_service.<env>) "
                             "(default: the paper recipe, exp/SEAL.yaml)")
    budget.add_argument("--set", dest="conf_overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one key of --conf (repeatable), e.g. "
                             "--set actor_rollout_ref.rollout.max_model_len=8192")
    budget.add_argument("--tokenizer", help="--endpoint: a local tokenizer folder to count the context and clip "
                                            "observations with, as the trainers do (without it the endpoint's "
                                            "reported prompt tokens enforce the budget; observations unclipped)")
    gen.add_argument("--repeats", type=int, default=1, help="repeat the whole evaluation k times")
    gen.add_argument("--seed", type=int, default=0, help="seed of repeat 0; repeat r uses seed + r")

    run = ap.add_argument_group("run")
    run.add_argument("--out", type=Path, help="experiment directory (default experiments/eval_<model name>)")
    run.add_argument("--step", type=int, default=0, help="step number of the log file <step>.jsonl")
    run.add_argument("--env-url", help="environment service URL (default: in-process environment)")
    run.add_argument("--params", default="{}", help="extra per-episode env params as JSON")
    run.add_argument("--concurrency", type=int, default=4, help="episodes in flight")
    run.add_argument("--max-retries", type=int, default=3, help="--endpoint: retries per request")
    run.add_argument("--timeout", type=float, default=300.0, help="--endpoint: seconds per request")
    run.add_argument("--fresh", action="store_true", help="discard this step's log instead of resuming")
    run.add_argument("--max-message-chars", type=int, help="truncate each logged message to N chars")
    run.add_argument("--export-bfcl", type=Path, help="also write BFCL FC result files under this dir")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("--max-errored-frac", type=float, default=0.0,
                     help="exit with code 3 when more than this fraction of a repeat's tasks could not be run "
                          "(LLM or environment failure after retries; never scored; default %(default)s: any)")


def build_policy(args: argparse.Namespace) -> Any:
    from seal.eval.policies import HFChatPolicy, OpenAIChatPolicy

    if bool(args.model) == bool(args.endpoint):
        raise SystemExit("seal eval: pass exactly one of --model PATH or --endpoint URL")
    if args.model:
        if not Path(args.model).is_dir():
            raise SystemExit(f"seal eval: --model {args.model} is not a directory (a HF checkpoint)")
        check_reachable(args)
        return HFChatPolicy(args.model, device=args.device, dtype=args.dtype, max_batch_size=args.batch_size,
                            max_batch_tokens=args.batch_tokens,
                            prefix_cache_tokens=args.prefix_cache_tokens)
    if not args.served_model:
        raise SystemExit("seal eval: --endpoint needs --served-model NAME")
    check_reachable(args)
    if args.tokenizer and not (Path(args.tokenizer) / "tokenizer_config.json").is_file():
        raise SystemExit(f"seal eval: --tokenizer {args.tokenizer}: no tokenizer_config.json there (a local "
                         "tokenizer or checkpoint folder)")
    return OpenAIChatPolicy(args.endpoint, args.served_model, api_key=os.environ.get(args.api_key_env),
                            max_concurrency=args.concurrency, max_retries=args.max_retries,
                            timeout_s=args.timeout, tokenizer_path=args.tokenizer)


def client_factory(env_url: str | None, env: str = "bfcl") -> Callable[[], Any]:
    """Clients of the service at ``env_url``, or of an in-process service of the environment ``env``."""
    from env_service.client import EnvClient

    if env_url:
        return lambda: EnvClient(env_url)
    return lambda: EnvClient.in_process(env=env)


def settings_from_args(args: argparse.Namespace) -> Any:
    from seal.eval.policies import SamplingSettings
    from seal.eval.evaluate import EvalSettings

    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"seal eval: --params is not JSON ({exc})") from None
    if not isinstance(params, dict):
        raise SystemExit("seal eval: --params must be a JSON object")

    def split_csv(text: str | None) -> list[str] | None:
        return [t.strip() for t in text.split(",") if t.strip()] if text else None

    budget, env, params = protocol_from_args(args, params)
    return EvalSettings(
        split=args.split, env=env, task_ids=split_csv(args.tasks), categories=split_csv(args.categories),
        per_category=args.per_category, limit=args.limit, step=args.step, repeats=args.repeats,
        seed=args.seed, concurrency=args.concurrency, max_llm_calls=args.max_llm_calls, budget=budget,
        params=params,
        sampling=SamplingSettings(temperature=args.temperature, top_p=args.top_p,
                                  max_tokens=args.max_new_tokens or budget.per_call_tokens),
        resume=not args.fresh, max_prompt_tokens=args.max_prompt_tokens,
        max_message_chars=args.max_message_chars, progress=not args.no_progress,
    )


def default_out_dir(args: argparse.Namespace) -> Path:
    name = Path(args.model).name if args.model else str(args.served_model).replace("/", "_")
    return Path("experiments") / f"eval_{name}"


def format_summary(summary: Any) -> str:
    from seal.eval.stats import order_categories

    lines = [f"evaluated {len(summary.task_ids)} tasks x {len(summary.repeats)} repeat(s) -> {summary.out_dir}"]
    if summary.skipped:
        lines.append(f"skipped (prompt too long): {', '.join(sorted(summary.skipped))}")
    for rep in summary.repeats:
        cells = [f"{c}: {v['n_pass']}/{v['n']}" for c, v in rep.counts.items()]
        lines.append(f"repeat {rep.repeat} (seed {rep.seed}): " + ", ".join(cells)
                     + (f"  [{rep.errors} errored: not run to the end (LLM or environment failure), "
                        "left out of the pass rates]" if rep.errors else ""))
    keys = order_categories(k for k in summary.mean_std if k not in ("overall", "category_mean"))
    for k in [*keys, "overall", "category_mean"]:
        m, s = summary.mean_std.get(k, (float("nan"), float("nan")))
        lines.append(f"  {k:28s} {100 * m:6.2f} +- {100 * s:5.2f}")
    return "\n".join(lines)


def check_reachable(args: argparse.Namespace) -> None:
    """Fail at once, in one line, when the endpoint or the environment service does not answer
    (rather than record every task as errored after its retries)."""
    import httpx

    if args.endpoint:
        try:
            httpx.get(args.endpoint.rstrip("/") + "/models", timeout=10.0)
        except httpx.HTTPError as exc:
            raise SystemExit(f"seal eval: --endpoint {args.endpoint}: nothing answers there ({type(exc).__name__}: "
                             f"{exc}); start the server or fix the URL") from None
    if args.env_url:
        from env_service.client import EnvClient

        with EnvClient(args.env_url, timeout_s=10.0, retries=0) as client:
            if not client.healthz():
                raise SystemExit(f"seal eval: --env-url {args.env_url}: the environment service does not answer "
                                 "/healthz; start it (python -m env_service --port <port>) or drop --env-url")


def errored_exit_code(summary: Any, max_frac: float) -> int:
    """3 when a repeat has more errored tasks than ``max_frac`` of its tasks, else 0."""
    worst = max((rep.errors / max(len(summary.task_ids), 1) for rep in summary.repeats), default=0.0)
    if worst > max_frac:
        print(f"seal eval: {100 * worst:.1f}% of the tasks could not be run (LLM or environment failure; "
              f"--max-errored-frac {max_frac}); the pass rates above leave them out; run the same command "
              "again to redo them", file=sys.stderr)
        return 3
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from seal.eval.export import export_log
    from seal.eval.evaluate import repeat_dir, run_eval

    settings = settings_from_args(args)
    policy = build_policy(args)
    out = args.out or default_out_dir(args)
    summary = run_eval(settings, policy, client_factory(args.env_url, settings.env), out)
    print(format_summary(summary))
    if args.export_bfcl:
        for rep in summary.repeats:
            log = repeat_dir(Path(out), rep.repeat, settings.repeats) / "validation_log" / f"{settings.step}.jsonl"
            files = export_log(log, repeat_dir(args.export_bfcl, rep.repeat, settings.repeats))
            print(f"BFCL result files: {', '.join(str(p) for p in files.values())}")
    return errored_exit_code(summary, args.max_errored_frac)


def cmd_export(args: argparse.Namespace) -> int:
    from seal.eval.export import export_log

    files = export_log(args.log, args.out, model=args.bfcl_model)
    for cat, path in files.items():
        print(f"{cat}: {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare a log's verdicts with ``bfcl evaluate``'s score files; exit 1 on any disagreement."""
    from seal.eval.export import read_bfcl_scores
    from seal.eval.logs import read_log_file
    from seal.eval.roundtrip import compare
    from seal.eval.stats import dedupe_latest

    records = [r for r in dedupe_latest(read_log_file(args.log)) if not r.get("error")]
    official = read_bfcl_scores(args.root, [r["task_id"] for r in records], model=args.bfcl_model)
    problems = compare(records, official)
    n_valid = sum(1 for r in records if r["valid"])
    n_official = sum(1 for v in official.values() if v[0])
    print(f"entries: {len(records)}; valid: ours {n_valid}, BFCL {n_official}; "
          f"agreement on (valid, error_type): {len(records) - len(problems)}/{len(records)}")
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


def cmd_config(args: argparse.Namespace) -> int:
    """``seal config --show``: every SEAL key with its default, doc and allowed values (:mod:`seal.schema`)."""
    from seal.schema import entries, leaf_specs

    if not args.show:
        raise ValueError("nothing to do (fix: seal config --show)")
    specs = leaf_specs()
    for key, default, doc in entries():
        print(f"{key} = {json.dumps(default)}")
        print(f"    {doc}" if doc else "    (no doc)")
        print(f"    allowed: {specs[key].allowed()}")
    print("env_service.<env> = {...}\n    The environment's per-episode params; its params model is their schema "
          "(exp/seal_base.yaml holds the recipe's env_service.bfcl).")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="seal", description="SEAL command line")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--debug", action="store_true", help="show the full traceback of any error (also SEAL_DEBUG=1)")
    sub = ap.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="evaluate a checkpoint or an endpoint on a BFCL split")
    add_eval_arguments(ev)
    ev.set_defaults(func=cmd_eval)
    ex = sub.add_parser("export-bfcl", help="write a validation log as BFCL FC result files")
    ex.add_argument("--log", type=Path, required=True, help="a <step>.jsonl validation log")
    ex.add_argument("--out", type=Path, required=True, help="BFCL project root to write result/ under")
    ex.add_argument("--bfcl-model", default="gpt-4o-2024-11-20-FC", help="an FC model name BFCL knows")
    ex.set_defaults(func=cmd_export)
    cmp = sub.add_parser("compare-bfcl", help="compare a log's verdicts with bfcl evaluate's scores")
    cmp.add_argument("--log", type=Path, required=True, help="the exported <step>.jsonl validation log")
    cmp.add_argument("--root", type=Path, required=True, help="the BFCL project root holding score/")
    cmp.add_argument("--bfcl-model", default="gpt-4o-2024-11-20-FC")
    cmp.set_defaults(func=cmd_compare)
    cf = sub.add_parser("config", help="the SEAL config keys")
    cf.add_argument("--show", action="store_true", help="list every SEAL key with its default and doc")
    cf.set_defaults(func=cmd_config)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    debug = args.debug or os.environ.get("SEAL_DEBUG", "").lower() in ("1", "true", "yes")
    try:
        return args.func(args)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        # Expected failures (a missing or unreadable file, a bad value, a service that went away)
        # are one line; --debug shows where they came from.
        if debug:
            raise
        text = str(exc).strip().splitlines()
        print(f"seal {args.command}: {type(exc).__name__}: {text[0] if text else ''}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
