"""The BFCL multi-turn task store: 800 tasks (4 categories x 200), loaded once per process.

Tasks come from the installed ``bfcl-eval`` package data (questions, ground truth and the
multi-turn function docs), found through the package itself rather than a fixed path. Each
task's tool list is built the way BFCL builds it (``populate_test_cases_with_predefined_functions``
followed by the Python language hint):

* the docs of the involved classes are concatenated in ``involved_classes`` order;
* for ``multi_turn_miss_func`` the held-out docs are removed from that list and kept per turn,
  to be revealed when the conversation reaches that turn;
* ``" Note that the provided function is in Python 3 syntax."`` is appended to the description
  of every doc in the initial list. BFCL moves the held-out docs aside *before* adding the note,
  so the revealed docs carry no note; we keep that.
* ``excluded_function`` (18 file-system entries per category) is ignored, as BFCL's code
  ignores it: those functions stay offered and executable, which is what BFCL scores.

Each task is a kit :class:`~env_service.kit.Task` (:class:`BfclTask`, with BFCL's entry and
held-out docs) in a kit :class:`~env_service.kit.TaskStore` (:func:`load_store`). The retired
``multi_turn_composite`` set (200 tasks, ``data/unused_datasets``) is an optional extra:
``load_store(include_composite=True)``.

Splits: the tasks carry none of their own; the store's split rule, :func:`load_split`, reads the project's ``data/`` parquet files (``bfcl_train.parquet``:
train, 400 tasks; ``bfcl_eval_400.parquet``: val 100 + test 300, by ``extra_info.split``; the task
id is ``extra_info.index``). ``data/bfcl_400_split.json`` is an older, *different* split (its
"train" list overlaps the eval parquet in 194 ids): it must not be used as an evaluation list.
The ``data/`` directory is found relative to this repository; the environment variable
``SEAL_DATA_DIR`` overrides it. ``test`` and ``eval`` are held out: :func:`load_split` (and the
store) answer them only inside :func:`seal_shared.held_out.final_evaluation`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

from env_service.kit import SPLITS, Task, TaskStore
from seal_shared.held_out import check_split_read
from seal_shared.types import category_of

logger = logging.getLogger(__name__)

CATEGORIES: tuple[str, ...] = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                "multi_turn_long_context")
COMPOSITE_CATEGORY = "multi_turn_composite"
PYTHON_NOTE = " Note that the provided function is in Python 3 syntax."
DATA_DIR_ENV = "SEAL_DATA_DIR"

_VERSION_PREFIX = "BFCL_v4"
_SPLIT_FILES = {"train": "bfcl_train.parquet", "val": "bfcl_eval_400.parquet",
                "test": "bfcl_eval_400.parquet"}


@dataclass(frozen=True, kw_only=True)
class BfclTask(Task):
    """One BFCL multi-turn task: a kit task (its ``user_turns`` are the user texts, ``""`` on a turn
    without one) plus BFCL's data.

    ``entry`` is the BFCL question dict as read from the package (``id``, ``question``,
    ``initial_config``, ``involved_classes``, ...). It is shared by every episode of the task and
    must never be mutated: consumers that need to change it take a deep copy. The same holds for
    the doc dicts in ``tools`` and ``held_out`` (turn -> the docs revealed there), which tasks share.
    """

    entry: dict[str, Any]
    held_out: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    involved_classes: tuple[str, ...] = ()
    long_context: bool = False

    def user_message(self, turn: int) -> str | None:
        """The user text of ``turn``, or ``None`` on a miss_func hold-out turn (no user message)."""
        return _user_text(self.entry["question"][turn])


def _user_text(messages: list[dict[str, Any]]) -> str | None:
    texts = [m["content"] for m in messages if m.get("role") == "user"]
    return "\n".join(texts) if texts else None


def bfcl_data_dir() -> Path:
    """The ``data`` directory of the installed bfcl-eval package."""
    return Path(str(resources.files("bfcl_eval") / "data"))


def is_long_context(task_id: str) -> bool:
    """BFCL loads backends with padding iff the id's category names long_context or composite."""
    category = category_of(task_id)
    return "long_context" in category or "composite" in category


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _load_func_docs(data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Class -> its func docs, as in the package (no note appended)."""
    doc_dir = data_dir / "multi_turn_func_doc"
    return {cls: _read_jsonl(doc_dir / fname) for cls, fname in MULTI_TURN_FUNC_DOC_FILE_MAPPING.items()
            if (doc_dir / fname).is_file()}


def _with_note(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "description": doc["description"] + PYTHON_NOTE}


def build_tools(entry: dict[str, Any], func_docs: dict[str, list[dict[str, Any]]],
                noted_docs: dict[str, list[dict[str, Any]]],
                ) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    """Build ``(initial tools, held-out docs per turn)`` for one entry, as BFCL does.

    ``func_docs``: class -> docs as shipped; ``noted_docs``: the same with the Python note
    appended. The returned dicts may be shared between tasks (the store builds each class's docs
    once): treat them as read-only and copy before changing.
    """
    tools: list[dict[str, Any]] = []
    plain: dict[str, dict[str, Any]] = {}
    for cls in entry["involved_classes"]:
        tools.extend(noted_docs[cls])
        plain.update((d["name"], d) for d in func_docs[cls])
    held_out: dict[int, list[dict[str, Any]]] = {}
    for turn_key, names in entry.get("missed_function", {}).items():
        docs: list[dict[str, Any]] = []
        for name in names:
            for i, doc in enumerate(tools):
                if doc["name"] == name:
                    tools.pop(i)
                    # BFCL moves held-out docs aside before appending the note: revealed docs have none.
                    docs.append(plain[name])
                    break
        held_out[int(turn_key)] = docs
    return tools, held_out


def load_store(include_composite: bool = False, data_dir: Path | None = None) -> TaskStore:
    """Read the four multi-turn categories (and optionally the retired composite set) into a store
    whose splits are SEAL's (:func:`load_split`)."""
    data_dir = data_dir or bfcl_data_dir()
    func_docs = _load_func_docs(data_dir)
    noted_docs = {cls: [_with_note(d) for d in docs] for cls, docs in func_docs.items()}
    sources = [(c, data_dir / f"{_VERSION_PREFIX}_{c}.json",
                data_dir / "possible_answer" / f"{_VERSION_PREFIX}_{c}.json") for c in CATEGORIES]
    if include_composite:
        unused = data_dir / "unused_datasets"
        name = f"{_VERSION_PREFIX}_{COMPOSITE_CATEGORY}.json"
        sources.append((COMPOSITE_CATEGORY, unused / "question" / name, unused / "possible_answer" / name))
    tasks: list[BfclTask] = []
    for category, question_path, answer_path in sources:
        answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(answer_path)}
        for entry in _read_jsonl(question_path):
            tid = entry["id"]
            if tid not in answers:
                raise ValueError(f"bfcl-eval data: task {tid!r} has no ground truth in {answer_path.name}")
            tools, held_out = build_tools(entry, func_docs, noted_docs)
            tasks.append(BfclTask(id=tid, category=category, split=None, entry=entry, gt_turns=answers[tid],
                                  user_turns=[_user_text(turn) or "" for turn in entry["question"]], tools=tools,
                                  held_out=held_out, involved_classes=tuple(entry["involved_classes"]),
                                  long_context=is_long_context(tid)))
    logger.debug("loaded %d BFCL multi-turn tasks from %s", len(tasks), data_dir)
    # The store guards its held-out splits itself (TaskStore.ids), so its rule is the unguarded read.
    return TaskStore(tasks, env="bfcl", splits=_read_split)


_DEFAULT_LOCK = threading.Lock()
_DEFAULT: dict[bool, TaskStore] = {}  # the per-process singletons, written once under the lock


def default_store(include_composite: bool = False) -> TaskStore:
    """The process-wide store, loaded on first use (about 0.1 s) and shared read-only."""
    with _DEFAULT_LOCK:
        if include_composite not in _DEFAULT:
            _DEFAULT[include_composite] = load_store(include_composite=include_composite)
        return _DEFAULT[include_composite]


def data_dir() -> Path:
    """The project's ``data/`` directory (``$SEAL_DATA_DIR`` overrides the in-repository one)."""
    override = os.environ.get(DATA_DIR_ENV)
    return Path(override) if override else Path(__file__).resolve().parents[2] / "data"


def load_split(name: str) -> list[str]:
    """Task ids of a SEAL split: ``train`` (400), ``val`` (100), ``test`` (300) or ``eval`` (val+test),
    from the parquet files (see the module docstring); ``test`` and ``eval`` only inside a final
    evaluation (``HeldOutSplitError`` elsewhere)."""
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
    check_split_read("bfcl", name)
    return _read_split(name)


def _read_split(name: str) -> list[str]:
    """:func:`load_split` without the held-out guard: the store's split rule (the store guards)."""
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")
    import pyarrow.parquet as pq  # deferred: only callers of splits pay for pyarrow

    wanted = ("val", "test") if name == "eval" else (name,)
    path = data_dir() / _SPLIT_FILES[wanted[0]]
    if not path.is_file():
        raise FileNotFoundError(f"split file {path} not found; set {DATA_DIR_ENV} to the directory "
                                f"holding bfcl_train.parquet and bfcl_eval_400.parquet")
    rows = pq.read_table(path, columns=["extra_info"]).column("extra_info").to_pylist()
    return [r["index"] for r in rows if r["split"] in wanted]
