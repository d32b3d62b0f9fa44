"""``seal eval``: evaluate a chat policy on an environment's tasks and write validation logs.

One episode (:func:`evaluate_episode`) goes through the one episode loop the trainers use
(:func:`seal.rollout.episode_loop.play_episode`: the same limits, budget, clipping and fault
handling), with :class:`seal.eval.policies.ChatGenerator` sending chat text to the policy.
Validation is greedy, one sample per task, with ``rollout_mode="validate"`` so the environment
shows the untouched interface. :func:`run_eval` selects the tasks, runs the repeats concurrently
and writes ``validation_log/<step>.jsonl`` and ``eval_summary.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from seal.environment import catalogue_of
from seal.episode import EpisodeResult, Evaluation
from seal.eval.logs import ValidationLogWriter, ValidationRecord, finished_keys, read_log_file
from seal.eval.policies import ChatGenerator, ChatPolicy, SamplingSettings
from seal.eval.stats import OVERALL, category_mean, dedupe_latest, mean_std, pass_counts
from seal.rewards import RewardConfig, episode_reward
from seal.rollout.episode_loop import EpisodeState, TaskRejected, play_attempt, release
from seal.rollout.settings import RolloutSettings
from seal_shared.held_out import HELD_OUT_SPLITS, final_evaluation, final_evaluation_reason

logger = logging.getLogger(__name__)

UNKNOWN_CATEGORY = "unknown"  # an episode whose environment never reported its task's category
VALIDATE_PARAMS: dict[str, Any] = {"rollout_mode": "validate"}


@dataclass
class EvalSettings:
    """What ``seal eval`` runs; every field maps to one command-line option."""

    split: str = "val"
    env: str = "bfcl"
    task_ids: list[str] | None = None
    categories: list[str] | None = None
    per_category: int | None = None
    limit: int | None = None
    step: int = 0
    repeats: int = 1
    seed: int = 0
    concurrency: int = 4
    max_llm_calls: int | None = None
    budget: RolloutSettings = field(default_factory=RolloutSettings)
    params: dict[str, Any] = field(default_factory=dict)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    resume: bool = True
    max_prompt_tokens: int | None = None
    max_message_chars: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.max_llm_calls is not None:  # an explicit limit overrides the budget's
            self.budget = replace(self.budget, max_llm_calls=self.max_llm_calls)
        self.max_llm_calls = self.budget.max_llm_calls
        for name in ("repeats", "concurrency", "max_llm_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")

    def episode_params(self) -> dict[str, Any]:
        return {**self.params, **VALIDATE_PARAMS}


def evaluate_episode(client: Any, policy: ChatPolicy, task_id: str, *, params: dict[str, Any],
                     sampling: SamplingSettings, budget: RolloutSettings | None = None, step: int = 0,
                     split: str | None = None, repeat: int = 0, category: str | None = None) -> ValidationRecord:
    """Play one validation episode through the episode loop and return its log record (errors
    are recorded, not raised). ``budget``: the trainers' :class:`RolloutSettings` (default the
    recipe's); ``category``: the task store's (default: the one the environment reports)."""
    budget = budget or RolloutSettings()
    t0 = time.monotonic()
    state = EpisodeState(ChatGenerator(policy, sampling))
    bug: BaseException | None = None
    try:
        asyncio.run(play_attempt(state, client, task_id, params, budget))
        fault = state.fault if state.llm_fault or state.env_fault else None
    except TaskRejected as exc:  # the environment's own 4xx, recorded as it answered
        fault = exc.__cause__
    except Exception as exc:  # a bug must not end the run either; its traceback is logged
        logger.exception("episode %s (repeat %d) failed", task_id, repeat)
        fault = bug = exc
    if fault is not None and fault is not bug:  # the LLM or the environment failed: one line
        logger.warning("episode %s (repeat %d) errored: %s: %s", task_id, repeat, type(fault).__name__,
                       str(fault).splitlines()[0] if str(fault) else "")
    record = _to_record(state, task_id, category, fault, generation=_generation_dict(sampling, budget), step=step,
                        split=split, repeat=repeat, seed=sampling.seed, elapsed_s=round(time.monotonic() - t0, 3))
    logger.info("%s: score %.1f, %d LLM calls, %s, %.1fs%s", task_id, record.score, record.num_llm_calls,
                record.terminated_reason, record.elapsed_s, f", error: {record.error}" if record.error else "")
    return record


def _to_record(state: EpisodeState, task_id: str, category: str | None, fault: BaseException | None,
               **line: Any) -> ValidationRecord:
    """The episode's log line through the one constructor the trainers use; the score is the
    binary verdict (``seal.rewards.episode_reward``). The log keeps the observation the model never
    saw, names every end the environment chose ``terminated`` and every fault ``error``, with the
    exception behind it."""
    if fault is not None:
        reason, evaluation = "error", None
    else:
        reason = "terminated" if state.env_terminated else state.terminated_reason or ""
        evaluation = Evaluation.from_wire(state.evaluation)
    messages = [*state.messages, *([state.unseen_observation] if state.unseen_observation else [])]
    result = EpisodeResult(
        task_id=task_id, category=category or str(state.category or UNKNOWN_CATEGORY),
        rollout_mode=VALIDATE_PARAMS["rollout_mode"], evaluation=evaluation, num_llm_calls=state.num_llm_calls,
        num_prompt_tokens=state.generator.prompt_tokens, num_response_tokens=state.generator.response_tokens,
        terminated_reason=reason, messages=tuple(messages),
        error=f"{type(fault).__name__}: {fault}" if fault is not None else None)
    reward = episode_reward(result, cfg=RewardConfig(), train=False)
    return ValidationRecord.from_episode(result.with_reward(reward.score, reward.meta), **line)


def _generation_dict(sampling: SamplingSettings, budget: RolloutSettings) -> dict[str, Any]:
    out = asdict(sampling)
    out.update(max_llm_calls=budget.max_llm_calls, n=1, episode_budget=budget.episode_budget,
               max_model_len=budget.max_model_len, response_length=budget.response_length)
    return out


def task_categories(env: str, ids: list[str]) -> dict[str, str]:
    """``task_id -> category`` as the environment's task store records it (one line for an unknown id)."""
    try:
        return catalogue_of(env).categories_of(list(ids))
    except KeyError as err:
        raise ValueError(f"environment {env!r} has no task {err.args[0]!r}: check --tasks") from None


def select_tasks(settings: EvalSettings, ids: list[str]) -> list[str]:
    """Apply the category filter and ``per_category`` (order preserved; ``limit`` is applied by the
    caller); categories are the task store's."""
    if not settings.categories and settings.per_category is None:
        return ids
    category = task_categories(settings.env, ids)
    if settings.categories:
        wanted = set(settings.categories)
        ids = [t for t in ids if category[t] in wanted]
    if settings.per_category is not None:
        seen: dict[str, int] = {}
        kept = []
        for t in ids:
            if seen.get(category[t], 0) < settings.per_category:
                kept.append(t)
                seen[category[t]] = seen.get(category[t], 0) + 1
        ids = kept
    return ids


def filter_prompt_length(client: Any, policy: ChatPolicy, ids: list[str], params: dict[str, Any],
                         max_prompt_tokens: int, limit: int | None) -> tuple[list[str], dict[str, int]]:
    """Keep tasks whose initial prompt fits ``max_prompt_tokens``; stop once ``limit`` fit.

    Returns the kept ids and ``{skipped id: prompt tokens}``. Needs a policy that can count
    tokens (``count_tokens``), i.e. a local checkpoint.
    """
    counter = getattr(policy, "count_tokens", None)
    if counter is None:
        raise ValueError("max_prompt_tokens needs a policy with a tokenizer (a local checkpoint)")
    kept: list[str] = []
    skipped: dict[str, int] = {}
    for tid in ids:
        if limit is not None and len(kept) >= limit:
            break
        created = client.create(tid, params)
        try:
            n = counter(created.messages)
        finally:
            release(client, created.instance_id)
        if n > max_prompt_tokens:
            logger.info("skipping %s: its prompt has %d tokens > max_prompt_tokens %d",
                        tid, n, max_prompt_tokens)
            skipped[tid] = n
        else:
            kept.append(tid)
    return kept, skipped


@dataclass
class RepeatResult:
    repeat: int
    seed: int
    log_path: str
    counts: dict[str, dict[str, int]]
    category_mean: float
    errors: int


@dataclass
class EvalSummary:
    out_dir: str
    step: int
    task_ids: list[str]
    skipped: dict[str, int]
    repeats: list[RepeatResult]
    mean_std: dict[str, tuple[float, float]]


def repeat_dir(out_dir: Path, repeat: int, repeats: int) -> Path:
    """The experiment dir of one repeat: ``out_dir`` itself, or ``out_dir/repeat_<k>``."""
    return out_dir if repeats == 1 else out_dir / f"repeat_{repeat}"


def run_eval(settings: EvalSettings, policy: ChatPolicy, client_factory: Callable[[], Any],
             out_dir: str | Path) -> EvalSummary:
    """Evaluate ``policy`` on the selected tasks ``settings.repeats`` times; write logs + summary.

    Each repeat writes ``<dir>/validation_log/<step>.jsonl`` (``dir`` = ``out_dir`` or
    ``out_dir/repeat_<k>``) and ``out_dir/eval_summary.json`` holds per-repeat pass counts and
    the mean and std over repeats. Finished tasks are skipped when ``settings.resume``.

    ``split`` ``test`` or ``eval`` makes this a final evaluation (:func:`seal_shared.held_out.final_evaluation`):
    the one reader of the held-out split, which is logged and recorded.
    """
    out_dir = Path(out_dir)
    local = threading.local()
    created: list[Any] = []
    lock = threading.Lock()

    def client() -> Any:
        # One client per worker thread: an in-process client owns its own service loop.
        if not hasattr(local, "client"):
            local.client = client_factory()
            with lock:
                created.append(local.client)
        return local.client

    final = settings.split in HELD_OUT_SPLITS
    scope = final_evaluation(f"seal eval --split {settings.split}") if final else contextlib.nullcontext()
    try:
        with scope:
            return _run_all(settings, policy, client, out_dir)
    finally:
        for c in {id(c): c for c in created}.values():
            close = getattr(c, "close", None)
            if close is not None:
                close()


def _run_all(settings: EvalSettings, policy: ChatPolicy, client: Callable[[], Any], out_dir: Path) -> EvalSummary:
    """Task selection, the repeats and the summary file (see :func:`run_eval`)."""
    ids = select_tasks(settings, settings.task_ids or list(catalogue_of(settings.env).load_split(settings.split)))
    skipped: dict[str, int] = {}
    if settings.max_prompt_tokens is not None:
        ids, skipped = filter_prompt_length(client(), policy, ids, settings.episode_params(),
                                            settings.max_prompt_tokens, settings.limit)
    elif settings.limit is not None:
        ids = ids[: settings.limit]
    if not ids:
        raise ValueError("no task left to evaluate: check --split/--tasks/--categories/--limit")
    split_of = _split_lookup(settings)
    category_of = _category_lookup(settings.env, ids)
    results = [_run_repeat(settings, policy, client, ids, out_dir, r, split_of, category_of)
               for r in range(settings.repeats)]
    summary = EvalSummary(out_dir=str(out_dir), step=settings.step, task_ids=ids, skipped=skipped,
                          repeats=results, mean_std=_aggregate(results))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval_summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def _category_lookup(env: str, ids: list[str]) -> Callable[[str], str | None]:
    """The task store's category of each task (None for an id the store lacks: the episode then
    takes the category its environment reports)."""
    env_tasks = catalogue_of(env)
    table = {t: env_tasks.categories[t] for t in ids if t in env_tasks}
    return table.get


def _split_lookup(settings: EvalSettings) -> Callable[[str], str | None]:
    """Maps a task id to ``train``/``val``/``test`` (None if in no split it may read): ``test`` is
    known inside a final evaluation only, so elsewhere a held-out task's records get None."""
    names = ("train", "val", "test") if final_evaluation_reason() is not None else ("train", "val")
    try:
        load_split = catalogue_of(settings.env).load_split
        return {str(tid): name for name in names for tid in load_split(name)}.get
    except (ImportError, FileNotFoundError) as exc:
        logger.warning("cannot map task ids to splits (%s); records get split=%r", exc, settings.split)
        return lambda _tid: settings.split


def _run_repeat(settings: EvalSettings, policy: ChatPolicy, client: Callable[[], Any], ids: list[str], out_dir: Path,
                repeat: int, split_of: Callable[[str], str | None],
                category_of: Callable[[str], str | None]) -> RepeatResult:
    seed = settings.seed + repeat
    sampling = replace(settings.sampling, seed=seed)
    set_seed = getattr(policy, "set_seed", None)
    if set_seed is not None:
        set_seed(seed)
    writer = ValidationLogWriter(repeat_dir(out_dir, repeat, settings.repeats) / "validation_log",
                                 max_message_chars=settings.max_message_chars)
    log_path = writer.path_for(settings.step)
    done = finished_keys(log_path) if settings.resume else set()
    if not settings.resume and log_path.exists():
        log_path.unlink()  # a fresh run must not mix with an older one in the same file
    todo = [t for t in ids if (t, repeat) not in done]
    if len(todo) < len(ids):
        logger.info("repeat %d: %d of %d tasks already logged, resuming", repeat,
                    len(ids) - len(todo), len(ids))

    def work(tid: str) -> ValidationRecord:
        return evaluate_episode(client(), policy, tid, params=settings.episode_params(),
                           sampling=sampling, budget=settings.budget,
                           step=settings.step, split=split_of(tid), repeat=repeat, category=category_of(tid))

    bar = tqdm(total=len(todo), desc=f"repeat {repeat}", unit="task", disable=not settings.progress)
    with bar, ThreadPoolExecutor(max_workers=settings.concurrency) as pool:
        for fut in as_completed([pool.submit(work, t) for t in todo]):
            writer.write(fut.result())
            bar.update(1)
    wanted = set(ids)
    records = [r for r in dedupe_latest(read_log_file(log_path))
               if r.get("task_id") in wanted and int(r.get("repeat", 0)) == repeat]
    counts = pass_counts(records)
    errors = counts[OVERALL].errored
    if errors:
        logger.warning("repeat %d: %d episodes could not be run (LLM or environment failure); they are left "
                       "out of the pass rates; run the same command again to redo them", repeat, errors)
    return RepeatResult(repeat=repeat, seed=seed, log_path=str(log_path), category_mean=category_mean(counts),
                        counts={c: {"n_pass": pc.n_pass, "n": pc.n, "errored": pc.errored} for c, pc in counts.items()},
                        errors=errors)


def _aggregate(results: list[RepeatResult]) -> dict[str, tuple[float, float]]:
    """Mean and std (over repeats) of each category's pass rate, the overall and the avg."""
    keys = {k for r in results for k in r.counts}
    out: dict[str, tuple[float, float]] = {}
    for k in keys:
        rates = [r.counts[k]["n_pass"] / r.counts[k]["n"] for r in results
                 if k in r.counts and r.counts[k]["n"]]
        out[k] = mean_std(rates)
    out["category_mean"] = mean_std([r.category_mean for r in results])
    out.setdefault(OVERALL, (float("nan"), float("nan")))
    return out
