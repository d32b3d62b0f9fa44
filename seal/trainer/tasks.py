"""Which tasks a run trains and validates on: ``data.*_files`` or explicit ids, then the
``seal.tasks`` filters. Both backends select their tasks here."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from seal.config_base import ConfigError, resolve_path, to_plain
from seal.environment import environment, held_out_problem, task_categories
from seal.schema import WarmStartKeys, block
from seal_shared.tags import known_tags, tag_definitions
from seal_shared.types import PaperLabel

logger = logging.getLogger(__name__)


def _files(value: Any) -> list[Path]:
    """Data files as the config check found them (:func:`seal.config_base.resolve_path`)."""
    return [resolve_path(str(f)) for f in ([value] if isinstance(value, str) else to_plain(value) or [])]


def ids_from_parquet(files: Sequence[Path], key: str) -> list[str]:
    """Task ids of verl-format parquet files (``extra_info.index``), in file order."""
    import pyarrow.parquet as pq

    ids: list[str] = []
    for path in files:
        if not path.is_file():
            raise ConfigError(f"{key}: {path} not found")
        rows = pq.read_table(path, columns=["extra_info"]).column("extra_info").to_pylist()
        ids.extend(str(r["index"]) for r in rows)
    return ids


def select_task_ids(cfg: DictConfig, split: str, *, prompt_tokens: Callable[[str], int] | None = None,
                    default_max_prompt_tokens: int | None = None) -> list[str]:
    """The task ids of ``split`` (``train`` / ``val``) after the ``seal.tasks`` filters.

    Source: ``seal.tasks.<split>_ids`` when set, else the ids in ``data.<split>_files``, else (no
    files either) the environment's own split; ids or files that name a task of the environment's
    held-out test split are refused unless ``validate_on_test`` (:func:`refuse_held_out_ids`), and
    the held-out split itself is never read. Then, in order: ``categories`` (as the
    environment's task store records them); for the training split, ``from_tags`` / ``from_log`` (see
    :func:`tasks_with_tags`); ``max_prompt_tokens`` (``default_max_prompt_tokens`` when unset;
    needs ``prompt_tokens(task_id)``, the rendered initial prompt length, see
    :mod:`seal.rollout.prompt_length`); the first ``max_<split>_tasks``, or for the training split
    with ``match_val_categories`` that many in the validation split's category shares
    (:func:`in_category_shares`).
    """
    from seal.rollout.prompt_length import fitting_tasks

    t = cfg.seal.tasks
    explicit = t.get(f"{split}_ids")
    files = _files(cfg.data.get(f"{split}_files"))
    if explicit:
        ids = refuse_held_out_ids(cfg, [str(i) for i in explicit], f"seal.tasks.{split}_ids")
    elif files:
        ids = refuse_held_out_ids(cfg, ids_from_parquet(files, f"data.{split}_files"), f"data.{split}_files")
    else:
        ids = environment(cfg).load_split(split)
    if t.categories:
        wanted = set(t.categories)
        categories = task_categories(cfg, ids)
        ids = [i for i in ids if categories[i] in wanted]
    if split == "train" and t.get("from_tags"):
        ids = tasks_with_tags(ids, t.get("from_log"), to_plain(t.from_tags))
    if split == "train":
        ids = without_warm_start_tasks(cfg, ids)
    max_tokens = t.max_prompt_tokens or default_max_prompt_tokens
    if max_tokens and prompt_tokens is not None:
        ids = fitting_tasks(ids, prompt_tokens, int(max_tokens), split=split)
    limit = t.get(f"max_{split}_tasks")
    if split == "train" and t.get("match_val_categories"):
        val_ids = select_task_ids(cfg, "val")
        categories = task_categories(cfg, [*ids, *val_ids])
        ids = in_category_shares(ids, categories, [categories[i] for i in val_ids], int(limit or len(ids)))
    elif limit:
        ids = ids[: int(limit)]
    if not ids:
        raise ConfigError(f"seal.tasks: no {split} task left after the filters; relax them or list "
                          f"seal.tasks.{split}_ids")
    return ids


def refuse_held_out_ids(cfg: DictConfig, ids: list[str], key: str) -> list[str]:
    """``ids`` (from ``key``) unless some are of the environment's held-out test split, which only a
    final evaluation may read (:func:`seal.environment.held_out_problem`: found without reading it).
    ``seal.tasks.validate_on_test`` lets them through with a warning: the paper's BFCL recipe
    validates on BFCL's val + test."""
    env = environment(cfg)
    held, problem = held_out_problem(env, ids, key)
    if not held:
        return ids
    if not cfg.seal.tasks.get("validate_on_test"):
        raise ConfigError(problem)
    logger.warning("seal.tasks.validate_on_test: %s names %d task(s) of %s's held-out test split (%s); results on "
                   "them are not a held-out measurement", key, len(held), env.name, ", ".join(held[:5]))
    return ids


def in_category_shares(ids: Sequence[str], categories: dict[str, str], reference: Sequence[str], n: int
                       ) -> list[str]:
    """``n`` of ``ids`` whose categories follow the shares of ``reference`` (one category per
    reference task), each category's first ids, in ``ids``' order.

    Each category gets ``n`` times its share, rounded by largest remainder. A category with fewer
    ids than its count gives the rest of its slots to the others, the most frequent in
    ``reference`` first, then to categories ``reference`` lacks, in ``ids``' order.
    """
    n = min(n, len(ids))
    pools: dict[str, list[str]] = {}
    for i in ids:
        pools.setdefault(categories[i], []).append(i)
    shares = Counter(reference)
    exact = {c: n * k / max(len(reference), 1) for c, k in shares.items()}
    counts = {c: int(x) for c, x in exact.items()}
    for c in sorted(exact, key=lambda c: exact[c] - counts[c], reverse=True)[: n - sum(counts.values())]:
        counts[c] += 1
    counts = {c: min(k, len(pools.get(c, []))) for c, k in counts.items()}
    order = [c for c, _ in shares.most_common()] + [c for c in pools if c not in shares]
    for c in order:
        extra = min(n - sum(counts.values()), len(pools.get(c, [])) - counts.get(c, 0))
        counts[c] = counts.get(c, 0) + extra
    chosen = {i for c, k in counts.items() for i in pools.get(c, [])[:k]}
    kept = [i for i in ids if i in chosen]
    logger.info("seal.tasks.match_val_categories: %d training tasks, %s", len(kept),
                ", ".join(f"{c} {k}" for c, k in sorted(counts.items()) if k))
    return kept


def warm_start_task_ids(cfg: Any) -> list[str]:
    """The supervised warm start's tasks: ``seal.warm_start.task_ids``, else the first ``max_tasks`` of the
    environment's train split (all of it when null). Every id must be a training task of the environment."""
    settings = block(WarmStartKeys, cfg, "seal.warm_start")
    env = environment(cfg)
    train = env.load_split("train")
    ids = [str(t) for t in settings.task_ids] if settings.task_ids else list(train)
    if settings.max_tasks:
        ids = ids[: int(settings.max_tasks)]
    outside = [t for t in ids if t not in set(train)]
    if outside:
        raise ConfigError(f"seal.warm_start.task_ids: {', '.join(outside[:5])} not in {env.name}'s train split; "
                          "the warm start trains on training tasks only")
    return ids


def without_warm_start_tasks(cfg: DictConfig, ids: list[str]) -> list[str]:
    """``ids`` less the warm start's tasks when ``seal.warm_start.exclude_from_rl`` (the default), so
    that the RL curve is measured on tasks the warm start never imitated."""
    settings = block(WarmStartKeys, cfg, "seal.warm_start")
    if not (settings.enable and settings.exclude_from_rl):
        return ids
    warm = set(warm_start_task_ids(cfg))
    kept = [i for i in ids if i not in warm]
    if len(kept) < len(ids):
        logger.info("seal.warm_start.exclude_from_rl: %d warm-start task(s) left out of RL training",
                    len(ids) - len(kept))
    return kept


def expand_tags(wanted: Sequence[str]) -> set[str]:
    """Failure-tag names for ``wanted``: each a registered tag (or the pseudo-tag ``unknown``),
    or a paper label (``invalid_tool_call``, ...) standing for the tags whose default paper label
    it is (each tag's ``paper_label`` in :mod:`seal_shared.tags`)."""
    tags = set(known_tags())
    labels = {str(label) for label in PaperLabel} - {str(PaperLabel.NONE)}
    out: set[str] = set()
    for name in wanted:
        name = str(name)
        if name in tags:
            out.add(name)
        elif name in labels:
            mapped = {str(d.name) for d in tag_definitions() if str(d.paper_label) == name}
            if not mapped:
                raise ConfigError(f"seal.tasks.from_tags: paper label {name!r} has no per-turn tag of its own (the "
                                  "log records tags, not episode events); list failure tags instead")
            out.update(mapped)
        else:
            raise ConfigError(f"seal.tasks.from_tags: unknown tag {name!r}; use failure tags {sorted(tags)} "
                              f"or paper labels {sorted(labels)}")
    return out


def _log_file(path: Path) -> Path:
    """The log file a ``from_log`` value names: a ``<step>.jsonl`` file, or the latest step
    file of a ``validation_log`` directory (or of an experiment directory holding one)."""
    from seal.eval.logs import step_of_file

    if path.is_file():
        return path
    if (path / "validation_log").is_dir():
        path = path / "validation_log"
    steps = sorted((s, p) for p in path.glob("*.jsonl") if (s := step_of_file(p)) is not None) if path.is_dir() else []
    if not steps:
        raise ConfigError(f"seal.tasks.from_log: {path} is neither a log file nor a directory of <step>.jsonl "
                          "logs; pass a validation log of a previous run or a `seal eval --out` directory")
    return steps[-1][1]


def tasks_with_tags(ids: Sequence[str], log_path: Any, wanted: Sequence[str]) -> list[str]:
    """The ids (in their order) whose episodes in the log at ``log_path`` carry any of the
    ``wanted`` tags (see :func:`expand_tags`). Runner errors carry no diagnosis and are
    skipped; of the rest, the latest record of a (task, repeat) counts (a resumed run's redo)."""
    from seal.eval.logs import read_log_file
    from seal.eval.stats import dedupe_latest

    if not log_path:
        raise ConfigError("seal.tasks.from_tags needs seal.tasks.from_log: the validation log (or `seal eval` "
                          "output directory) whose diagnoses select the tasks")
    tags = expand_tags(wanted)
    path = _log_file(_files(str(log_path))[0])
    records = dedupe_latest([r for r in read_log_file(path) if not r.get("error") and "task_id" in r])
    tagged = {str(r["task_id"]) for r in records if tags & set(r.get("tags") or [])}
    kept = [i for i in ids if i in tagged]
    logger.info("seal.tasks.from_tags %s: %d of %d logged tasks carry them (%s); %d of %d training tasks kept",
                sorted(tags), len(tagged), len({str(r["task_id"]) for r in records}), path, len(kept), len(ids))
    if not kept:
        raise ConfigError(f"seal.tasks.from_tags: no training task carries {sorted(tags)} in {path} "
                          f"({len(tagged)} logged tasks do); diagnose the training tasks first, e.g. "
                          "`seal eval --split train --out DIR`, and pass DIR as seal.tasks.from_log")
    return kept
