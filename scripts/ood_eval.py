#!/usr/bin/env python
"""Paper Table 2 for one served checkpoint: BFCL V4 Memory and Web Search with BFCL's own harness,
τ²-bench Retail / Airline / Telecom with τ²-bench's own runner; score files into one folder.

    CKPT=$(realpath experiments/SEAL/hf_checkpoint)
    vllm serve "$CKPT" --port 8000 &      # served under its absolute path (BFCL sends it)
    python scripts/ood_eval.py --endpoint http://127.0.0.1:8000/v1 \\
        --model-path "$CKPT" --out reports/ood/SEAL

Each harness lives in its own throwaway environment, never in the project's: bfcl-eval in
``.bench/bfcl-official/venv`` (the one scripts/bfcl_official_eval.sh builds, plus the tokenizer
libraries BFCL's local-model handler imports), τ²-bench cloned from its public repository into
``.bench/tau2-bench`` and installed there with ``uv sync``. A part that cannot run (no internet,
no API key, no git/uv) is skipped with a one-line reason, recorded in ``<out>/skipped.json``.
Then: ``python scripts/make_tables.py ... --ood seal=reports/ood/SEAL``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from seal.eval import ood  # noqa: E402

log = logging.getLogger("ood_eval")
BENCH = ROOT / ".bench"
BFCL_VENV = BENCH / "bfcl-official" / "venv"
BFCL_VERSION = "2026.3.23"
TAU2_DIR = BENCH / "tau2-bench"


def sh(cmd: ood.Command | list[str], *, log_file: Path | None = None) -> None:
    """Run a command (its output to ``log_file`` when given); a failure raises with its tail."""
    argv, env, cwd = (cmd.argv, cmd.env, cmd.cwd) if isinstance(cmd, ood.Command) else (cmd, {}, None)
    log.info("$ %s", " ".join(argv))
    out = subprocess.run(argv, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} failed (exit {out.returncode}): "
                           f"{(out.stderr or out.stdout)[-1500:]}")


def bfcl_venv(with_vector: bool) -> Path:
    """bfcl-eval's CLI venv, created as scripts/bfcl_official_eval.sh does, plus the tokenizer
    libraries (and sentence-transformers/faiss only for the vector memory backend)."""
    py = BFCL_VENV / "bin" / "python"
    if not (BFCL_VENV / ".ready").exists():
        sh(["bash", str(ROOT / "scripts" / "bfcl_official_eval.sh"), "--selftest", "1"])
    extras = ["transformers", "jinja2"] + (["sentence-transformers", "faiss-cpu==1.11.0"] if with_vector else [])
    missing = [e for e in extras if subprocess.run([str(py), "-m", "pip", "show", e.split("=")[0]],
                                                   capture_output=True).returncode != 0]
    if missing:
        sh([str(py), "-m", "pip", "install", "-q", *missing])
    return BFCL_VENV / "bin" / "bfcl"


def served_models(endpoint: str, api_key: str) -> list[str]:
    """The model ids ``GET <endpoint>/models`` lists."""
    import urllib.request

    req = urllib.request.Request(endpoint.rstrip("/") + "/models", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


def run_bfcl(args: argparse.Namespace, categories: list[str], out: Path) -> None:
    # BFCL's local-model handler sends --local-model-path as the model name; it runs from the
    # score folder, so the path is absolute and the server must serve that name.
    model_path = str(Path(args.model_path).resolve())
    names = served_models(args.endpoint, os.environ.get(args.api_key_env, "EMPTY"))
    if model_path not in names:
        raise RuntimeError(f"{args.endpoint} serves {names}, not {model_path}; serve the checkpoint with "
                           f"--served-model-name {model_path} (BFCL sends the checkpoint path as the model name)")
    bfcl = bfcl_venv("memory_vector" in categories)
    root = out / "bfcl"
    root.mkdir(parents=True, exist_ok=True)
    common = {"registry": args.bfcl_model, "categories": categories, "project_root": root.resolve()}
    sh(ood.bfcl_generate(bfcl, model_path=model_path, endpoint=args.endpoint,
                         api_key=os.environ.get(args.api_key_env, "EMPTY"), num_threads=args.concurrency, **common),
       log_file=root / "generate.log")
    sh(ood.bfcl_evaluate(bfcl, **common), log_file=root / "evaluate.log")


def run_tau2(args: argparse.Namespace, domain: str, out: Path) -> None:
    if not (TAU2_DIR / ".ready").exists():
        if not TAU2_DIR.exists():
            sh(["git", "clone", "--depth", "1", *(["--branch", args.tau2_ref] if args.tau2_ref else []),
                ood.TAU2_REPO, str(TAU2_DIR)])
        sh(["uv", "sync", "--directory", str(TAU2_DIR)])
        (TAU2_DIR / ".ready").touch()
    save_to = f"seal_{out.name}_{domain}"
    cmd = ood.tau2_run(TAU2_DIR / ".venv" / "bin" / "tau2", domain=domain, served_model=args.served_model,
                       endpoint=args.endpoint, api_key=os.environ.get(args.api_key_env, "EMPTY"),
                       user_llm=args.user_llm, user_llm_args=args.user_llm_args, save_to=save_to, repo=TAU2_DIR,
                       num_trials=args.num_trials, max_concurrency=args.concurrency)
    sh(cmd, log_file=out / "tau2" / domain / "run.log")
    found = ood.tau2_results_path(TAU2_DIR, save_to)
    if found is None:
        raise RuntimeError(f"tau2 run wrote no results under {TAU2_DIR / 'data' / 'simulations'} for {save_to}")
    shutil.copy(found, out / "tau2" / domain / "results.json")


def plan(args: argparse.Namespace, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(BFCL categories to run, {part: reason} for the parts skipped)."""
    skipped: dict[str, str] = {}
    cats: list[str] = []
    parts = set(args.parts)
    online = {h: ood.can_connect(h) for h in ("serpapi.com", "github.com")}
    if "web_search" in parts:
        reason = ood.web_search_skip_reason(env, online["serpapi.com"])
        if reason:
            skipped.update({c: reason for c in ood.WEB_SEARCH})
        else:
            cats += list(ood.WEB_SEARCH)
    if "memory" in parts:
        backends = [f"memory_{b}" for b in args.memory_backends.split(",")]
        cats += backends
        not_run = [m for m in ood.MEMORY if m not in backends]
        skipped.update({m: "not requested (--memory-backends; vector needs torch and an embedding-model "
                           "download)" for m in not_run})
    for domain in ood.TAU2_DOMAINS:
        if domain in parts:
            reason = ood.tau2_skip_reason(env, user_llm=args.user_llm, user_llm_args=args.user_llm_args,
                                          online=online["github.com"], have_repo=(TAU2_DIR / ".ready").exists())
            if reason:
                skipped[domain] = reason
    for part in ood.PARTS:
        if part not in parts:
            for key in (ood.WEB_SEARCH if part == "web_search" else ood.MEMORY if part == "memory" else (part,)):
                skipped.setdefault(key, "not requested (--parts)")
    return cats, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True, help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model-path", required=True, help="the served checkpoint's folder (config + tokenizer)")
    ap.add_argument("--served-model", help="model name the endpoint serves (default: --model-path; BFCL's "
                    "local-model handler always sends the path)")
    ap.add_argument("--api-key-env", default="OPENAI_ENDPOINT_KEY", help="variable holding the endpoint's key")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(ood.PARTS), help=f"comma-separated subset of {ood.PARTS}")
    ap.add_argument("--bfcl-model", default=ood.DEFAULT_BFCL_MODEL, help="bfcl-eval registry name (prompt format)")
    ap.add_argument("--memory-backends", default="kv,rec_sum", help="kv, rec_sum (offline) and/or vector")
    ap.add_argument("--user-llm", default=ood.TAU2_DEFAULT_USER_LLM, help="τ²-bench user simulator (LiteLLM name)")
    ap.add_argument("--user-llm-args", type=json.loads, default=None,
                    help='JSON for the user simulator, e.g. {"api_base": "http://127.0.0.1:8001/v1"}')
    ap.add_argument("--num-trials", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--tau2-ref", default=None, help="τ²-bench git tag or branch (default: its default branch)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(args.parts) - set(ood.PARTS))
    if unknown:
        print(f"ood_eval: unknown --parts {unknown}; known: {list(ood.PARTS)}", file=sys.stderr)
        return 2
    args.served_model = args.served_model or args.model_path
    args.out.mkdir(parents=True, exist_ok=True)

    cats, skipped = plan(args, dict(os.environ))
    jobs = ([("bfcl " + ",".join(cats), lambda: run_bfcl(args, cats, args.out), cats)] if cats else []) + [
        (f"tau2 {d}", (lambda d=d: run_tau2(args, d, args.out)), [d])
        for d in ood.TAU2_DOMAINS if d in args.parts and d not in skipped]
    for name, job, keys in jobs:
        try:
            job()
        except (RuntimeError, OSError, ValueError, KeyError) as exc:
            log.error("%s: %s", name, exc)
            skipped.update({k: f"failed: {str(exc).splitlines()[0][:300]}" for k in keys})
    (args.out / ood.SKIPPED_FILE).write_text(json.dumps(skipped, indent=1, sort_keys=True))
    for key, reason in sorted(skipped.items()):
        print(f"skipped {key}: {reason}")
    cells = ood.load_ood_dir(args.out, args.bfcl_model)
    print(" | ".join(f"{ood.COLUMN_NAMES[c]} {cells[c].value:.2f}" for c in ood.TABLE2_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
