"""Paper Table 2, the out-of-distribution evaluations: BFCL V4 Web Search and Memory with BFCL's
own harness (``bfcl generate`` / ``bfcl evaluate``), and τ²-bench Retail, Airline and Telecom with
τ²-bench's own runner (``tau2 run``), both against a served checkpoint.

This module composes their commands, says why a part cannot run here, and reads the score files
the harnesses write, in their own formats:

* BFCL: ``<root>/score/<registry name, '/' -> '_'>/agentic/.../BFCL_v4_<category>_score.json``,
  JSON lines whose first line is the header ``{"accuracy", "correct_count", "total_count"}``.
  BFCL's summaries are unweighted means of category accuracies: Web Search = mean(base,
  no_snippet), Memory = mean(kv, vector, rec_sum), Agentic (the paper's "V4 Avg") = their mean.
* τ²-bench: ``results.json`` with ``simulations: [{task_id, trial, reward_info: {reward}}]``; a
  simulation succeeds when its reward is 1 (± 1e-6, τ²-bench's ``is_successful``); pass^1 is the
  mean over tasks of the task's success fraction over trials. A simulation without a
  ``reward_info`` (an infrastructure error) counts as a failure.

The evaluation folder (written by ``scripts/ood_eval.py``, read by ``scripts/make_tables.py``):
``bfcl/`` (BFCL's project root: result/ and score/), ``tau2/<domain>/results.json`` and
``skipped.json`` (``{part: reason}`` for every part that did not run).
"""

from __future__ import annotations

import json
import math
import shutil
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seal.eval.paper_numbers import TABLE2_COLUMNS

WEB_SEARCH = ("web_search_base", "web_search_no_snippet")
MEMORY = ("memory_kv", "memory_vector", "memory_rec_sum")
TAU2_DOMAINS = ("retail", "airline", "telecom")
COLUMN_NAMES = {"v4_avg": "V4 Avg", "web_search": "WebSearch", "memory": "Memory", "tau2_avg": "τ² Avg",
                "retail": "Retail", "airline": "Airline", "telecom": "Telecom"}
PARTS = ("web_search", "memory", *TAU2_DOMAINS)

BFCL_VERSION_PREFIX = "BFCL_v4"
# bfcl-eval 2026.3.23 has no Qwen2.5 entry; this registry name selects its Qwen FC handler
# (Hermes-style <tools>/<tool_call> prompt, the format Qwen2.5-Instruct's template uses) for a
# non-thinking instruct model. Which entry the paper used is not stated.
DEFAULT_BFCL_MODEL = "Qwen/Qwen3-4B-Instruct-2507-FC"
TAU2_REPO = "https://github.com/sierra-research/tau2-bench"
# τ²-bench's own default user simulator (src/tau2/config.py DEFAULT_LLM_USER).
TAU2_DEFAULT_USER_LLM = "gpt-4.1-2025-04-14"
SKIPPED_FILE = "skipped.json"


@dataclass(frozen=True)
class Score:
    """``passed`` of ``total`` (``passed`` may be fractional: pass^1 over several trials)."""

    passed: float
    total: int

    @property
    def rate(self) -> float:
        """Percent; NaN when there is nothing to count."""
        return 100.0 * self.passed / self.total if self.total else math.nan


@dataclass
class Cell:
    """One Table 2 value (percent, NaN when not measured) and what it is made of."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    n: int = 0


def read_bfcl_score_file(path: str | Path) -> Score:
    """The header line of a ``BFCL_v4_<category>_score.json``."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        first = fh.readline()
    try:
        header = json.loads(first)
        return Score(float(header["correct_count"]), int(header["total_count"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: first line is not BFCL's score header "
                         f"{{accuracy, correct_count, total_count}} ({exc})") from None


def bfcl_category_scores(root: str | Path, registry: str | None = None) -> dict[str, Score]:
    """``{category: Score}`` for the agentic categories BFCL scored under ``<root>/score``.

    ``registry``: the BFCL model name; None accepts the one model folder present (two or more
    is ambiguous and raises).
    """
    score_dir = Path(root) / "score"
    if not score_dir.is_dir():
        return {}
    if registry is not None:
        models = [score_dir / registry.replace("/", "_")]
    else:
        models = sorted(p for p in score_dir.iterdir() if p.is_dir())
        if len(models) > 1:
            raise ValueError(f"{score_dir}: scores of several models ({[m.name for m in models]}); name one")
    out: dict[str, Score] = {}
    for model in models:
        for cat in (*WEB_SEARCH, *MEMORY):
            found = sorted(model.rglob(f"{BFCL_VERSION_PREFIX}_{cat}_score.json"))
            if found:
                out[cat] = read_bfcl_score_file(found[0])
    return out


def read_tau2_results(path: str | Path) -> Score:
    """pass^1 of a τ²-bench ``results.json``: ``passed`` = Σ over tasks of successes / trials."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        sims = data["simulations"] if isinstance(data, Mapping) else data
        per_task: dict[str, list[bool]] = {}
        for sim in sims:
            info = sim.get("reward_info") or {}
            reward = info.get("reward") if isinstance(info, Mapping) else None
            ok = reward is not None and (1 - 1e-6) <= float(reward) <= (1 + 1e-6)
            per_task.setdefault(str(sim["task_id"]), []).append(ok)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a τ²-bench results file with simulations[].task_id/reward_info ({exc})") from None
    passed = sum(sum(v) / len(v) for v in per_task.values())
    return Score(passed, len(per_task))


def summary(scores: Mapping[str, Score], categories: Sequence[str]) -> Cell:
    """BFCL's summary of ``categories``: the unweighted mean of their accuracies (percent), over
    those present; the absent ones are listed in ``missing`` (BFCL would count them as 0)."""
    parts = {c: scores[c].rate for c in categories if c in scores}
    missing = tuple(c for c in categories if c not in scores)
    value = sum(parts.values()) / len(parts) if parts else math.nan
    return Cell(value, parts, missing, sum(scores[c].total for c in parts))


def read_skipped(folder: str | Path) -> dict[str, str]:
    path = Path(folder) / SKIPPED_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def load_ood_dir(folder: str | Path, registry: str | None = None) -> dict[str, Cell]:
    """The Table 2 cells of one evaluation folder (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"OOD folder {folder} does not exist; write it with scripts/ood_eval.py --out")
    bfcl = bfcl_category_scores(folder / "bfcl", registry)
    cells = {"web_search": summary(bfcl, WEB_SEARCH), "memory": summary(bfcl, MEMORY)}
    for domain in TAU2_DOMAINS:
        path = folder / "tau2" / domain / "results.json"
        score = read_tau2_results(path) if path.is_file() else Score(0, 0)
        cells[domain] = Cell(score.rate, {domain: score.rate} if score.total else {},
                             () if score.total else (domain,), score.total)
    cells["v4_avg"] = _mean_cell(cells, ("web_search", "memory"))
    cells["tau2_avg"] = _mean_cell(cells, TAU2_DOMAINS)
    return cells


def _mean_cell(cells: Mapping[str, Cell], keys: Sequence[str]) -> Cell:
    """The paper's averages: the mean of the columns, NaN unless all of them were measured."""
    values = [cells[k].value for k in keys]
    value = sum(values) / len(values) if not any(math.isnan(v) for v in values) else math.nan
    return Cell(value, {k: cells[k].value for k in keys}, tuple(k for k in keys if math.isnan(cells[k].value)),
                sum(cells[k].n for k in keys))


@dataclass(frozen=True)
class Command:
    """A harness command: argv, the environment variables it adds, and its working directory."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


def bfcl_generate(bfcl: str | Path, *, registry: str, categories: Sequence[str], model_path: str | Path,
                  endpoint: str, api_key: str, project_root: str | Path, num_threads: int = 8) -> Command:
    """``bfcl generate`` against an already-served OpenAI-compatible endpoint.

    BFCL's local-model handler renders the prompt itself with the checkpoint's tokenizer
    (``--local-model-path``) and calls ``/v1/completions`` with that same path as the model
    name, so the server must serve the checkpoint under its path (``vllm serve <path>``).
    """
    return Command(
        [str(bfcl), "generate", "--model", registry, "--test-category", ",".join(categories),
         "--skip-server-setup", "--local-model-path", str(model_path), "--num-threads", str(num_threads)],
        {"BFCL_PROJECT_ROOT": str(project_root), "REMOTE_OPENAI_BASE_URL": endpoint.rstrip("/"),
         "REMOTE_OPENAI_API_KEY": api_key, "REMOTE_OPENAI_TOKENIZER_PATH": str(model_path)},
        Path(project_root))


def bfcl_evaluate(bfcl: str | Path, *, registry: str, categories: Sequence[str], project_root: str | Path) -> Command:
    """``bfcl evaluate`` of the generated categories (``--partial-eval``: not the full set)."""
    return Command([str(bfcl), "evaluate", "--model", registry, "--test-category", ",".join(categories),
                    "--partial-eval"], {"BFCL_PROJECT_ROOT": str(project_root), "OPENAI_API_KEY": "dummy"},
                   Path(project_root))


def tau2_run(tau2: str | Path, *, domain: str, served_model: str, endpoint: str, api_key: str, user_llm: str,
             user_llm_args: Mapping[str, Any] | None, save_to: str, repo: str | Path, num_trials: int = 1,
             max_concurrency: int = 3, seed: int = 300, temperature: float = 0.0) -> Command:
    """``tau2 run`` of one domain with the served checkpoint as the agent (through LiteLLM's
    ``openai/`` provider at ``endpoint``) and ``user_llm`` as the user simulator. τ²-bench's
    defaults otherwise: the ``base`` task split, seed 300, 200 steps, 10 errors."""
    if domain not in TAU2_DOMAINS:
        raise ValueError(f"τ²-bench domain {domain!r}: expected one of {TAU2_DOMAINS}")
    agent_args = {"api_base": endpoint.rstrip("/"), "api_key": api_key, "temperature": temperature}
    argv = [str(tau2), "run", "--domain", domain, "--agent-llm", f"openai/{served_model}",
            "--agent-llm-args", json.dumps(agent_args), "--user-llm", user_llm,
            "--num-trials", str(num_trials), "--max-concurrency", str(max_concurrency), "--seed", str(seed),
            "--save-to", save_to, "--auto-resume"]
    if user_llm_args:
        argv += ["--user-llm-args", json.dumps(dict(user_llm_args))]
    return Command(argv, {}, Path(repo))


def tau2_results_path(repo: str | Path, save_to: str) -> Path | None:
    """Where ``tau2 run --save-to NAME`` left its results: ``data/simulations/NAME/results.json``
    (τ³-era layout) or ``data/simulations/NAME.json`` (earlier releases); None when neither."""
    sims = Path(repo) / "data" / "simulations"
    for p in (sims / save_to / "results.json", sims / f"{save_to}.json"):
        if p.is_file():
            return p
    return None


def can_connect(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def web_search_skip_reason(env: Mapping[str, str], online: bool) -> str | None:
    """Why BFCL Web Search cannot run (it calls SerpAPI live), or None."""
    if not env.get("SERPAPI_API_KEY"):
        return "SERPAPI_API_KEY is not set (BFCL Web Search queries SerpAPI live)"
    if not online:
        return "no internet connection (serpapi.com:443 unreachable; BFCL Web Search queries it live)"
    return None


def tau2_skip_reason(env: Mapping[str, str], *, user_llm: str, user_llm_args: Mapping[str, Any] | None,
                     online: bool, have_repo: bool, tools: Mapping[str, bool] | None = None) -> str | None:
    """Why τ²-bench cannot run, or None: it installs from its public repository and needs a
    user-simulator model (an API model needs its key; a local one its ``api_base``)."""
    tools = dict(tools if tools is not None else {t: shutil.which(t) is not None for t in ("git", "uv")})
    missing = [t for t, ok in tools.items() if not ok]
    if missing:
        return f"{', '.join(missing)} not found (τ²-bench installs with git and uv)"
    if not have_repo and not online:
        return f"no internet connection to clone {TAU2_REPO}"
    local_user = bool(user_llm_args and user_llm_args.get("api_base"))
    if not local_user:
        key = _provider_key(user_llm)
        if key and not env.get(key):
            return f"{key} is not set for the user simulator {user_llm} (or pass --user-llm-args with an api_base)"
        if not online:
            return f"no internet connection for the user simulator {user_llm}"
    return None


def _provider_key(model: str) -> str | None:
    """The API-key variable LiteLLM reads for ``model``'s provider (None: unknown provider)."""
    provider = model.split("/", 1)[0] if "/" in model else ""
    if provider in ("", "openai") and model.split("/")[-1].startswith(("gpt", "o1", "o3", "o4")):
        return "OPENAI_API_KEY"
    return {"anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY", "azure": "AZURE_API_KEY",
            "openai": "OPENAI_API_KEY"}.get(provider)


def table2_cells(folders: Mapping[str, Path], reference: Mapping[str, Mapping[str, float]],
                 labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """One dict per (row, column): ours, paper, diff, the parts and what was not measured."""
    out = []
    for row, folder in folders.items():
        cells = load_ood_dir(folder)
        skipped = read_skipped(folder)
        for col in TABLE2_COLUMNS:
            c = cells[col]
            ref = reference.get(row, {}).get(col, math.nan)
            out.append({"row": row, "label": labels.get(row, row), "column": col, "ours": c.value, "n": c.n,
                        "paper": ref, "diff": c.value - ref,
                        "missing": ";".join(f"{m} ({skipped[m]})" if m in skipped else m for m in c.missing),
                        "path": str(folder)})
    return out


def table2_markdown(cells: Sequence[Mapping[str, Any]], note: str) -> str:
    lines = ["### Table 2: out-of-distribution transfer", "", note, "",
             "| Setting | " + " | ".join(COLUMN_NAMES[c] for c in TABLE2_COLUMNS) + " |",
             "|---|" + "---|" * len(TABLE2_COLUMNS)]
    rows: dict[str, list[Mapping[str, Any]]] = {}
    for c in cells:
        rows.setdefault(c["row"], []).append(c)
    notes = []
    for cs in rows.values():
        parts = []
        for c in cs:
            ours = "-" if math.isnan(c["ours"]) else f"{c['ours']:.2f}"
            paper = "-" if math.isnan(c["paper"]) else f"{c['paper']:.2f}"
            diff = "" if math.isnan(c["diff"]) else f", Δ {c['diff']:+.2f}"
            parts.append(f"{ours} (paper {paper}{diff})")
            if c["missing"] and c["column"] in ("web_search", "memory", *TAU2_DOMAINS):
                notes.append(f"- {cs[0]['label']}, {COLUMN_NAMES[c['column']]}: not measured: {c['missing']}")
        lines.append(f"| {cs[0]['label']} | " + " | ".join(parts) + " |")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def write_table2_csv(path: Path, cells: Sequence[Mapping[str, Any]]) -> None:
    import csv

    keys = ["row", "label", "column", "ours", "n", "paper", "diff", "missing", "path"]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for c in cells:
            w.writerow({k: (f"{c[k]:.4f}" if isinstance(c[k], float) and not math.isnan(c[k]) else
                            ("" if isinstance(c[k], float) else c[k])) for k in keys})
