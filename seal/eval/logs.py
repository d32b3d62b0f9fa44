"""Validation logs: one JSON object per episode in ``<log_dir>/<step>.jsonl`` (the line format is
listed in docs/architecture.md, "Validation log line").

The line format is a superset of the SEAL release's (``input``, ``output``, ``score``, ``step``,
``reward``, ``task_id``, ``data_source``), so the statistics script reads both. Our extra keys
carry the verdict, the per-turn failure tags, the call and token counts, the messages and the
generation settings, and ``model_turns`` (turn -> step -> call strings) for the BFCL export.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from seal.episode import EpisodeResult

logger = logging.getLogger(__name__)

# A task passes when its score reaches 1.0, the release's rule (binary verifier reward).
PASS_THRESHOLD = 1.0

_STEP_FILE = re.compile(r"^(-?\d+)\.jsonl$")
_TRUNCATION_MARK = "\n[... {n} characters truncated ...]\n"


@dataclass
class ValidationRecord:
    """One validation episode, as written to the log.

    ``messages`` is the full conversation ([system, user, assistant, observation, ...]); the
    release-compatible ``input`` (system + first user text) and ``output`` (everything after)
    are derived from it when the record is serialised.
    """

    task_id: str
    data_source: str
    split: str | None
    step: int
    score: float
    reward: float
    valid: bool
    error_type: str | None = None
    tags: list[str] = field(default_factory=list)
    num_llm_calls: int = 0
    num_prompt_tokens: int = 0
    num_response_tokens: int = 0
    terminated_reason: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    generation: dict[str, Any] = field(default_factory=dict)
    model_turns: list[list[list[str]]] | None = None
    repeat: int = 0
    seed: int | None = None
    elapsed_s: float = 0.0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_episode(cls, result: EpisodeResult, *, step: int, split: str | None, generation: Mapping[str, Any],
                     repeat: int = 0, seed: int | None = None, elapsed_s: float = 0.0,
                     extra: Mapping[str, Any] | None = None) -> ValidationRecord:
        """The log line of one episode: the one constructor the trainers, ``seal eval`` and the
        roundtrip check share. ``score`` is the binary verdict the paper's tables count;
        ``reward`` the episode's reward; ``extra`` joins the evaluation's turn-level figures."""
        evaluation = result.evaluation
        return cls(
            task_id=result.task_id, data_source=result.category, split=split, step=int(step),
            score=1.0 if result.valid else 0.0, reward=float(result.reward), valid=result.valid,
            error_type=result.error_type, tags=[str(t) for t in result.tags],
            num_llm_calls=result.num_llm_calls, num_prompt_tokens=result.num_prompt_tokens,
            num_response_tokens=result.num_response_tokens, terminated_reason=result.terminated_reason,
            messages=[dict(m) for m in result.messages], generation=dict(generation),
            model_turns=result.model_turns, repeat=repeat, seed=seed, elapsed_s=elapsed_s,
            error=result.fault_text(),
            extra={**(evaluation.log_extra() if evaluation is not None else {}), **(extra or {})},
        )

    def to_json_dict(self, *, max_message_chars: int | None = None) -> dict[str, Any]:
        """The log line as a dict; ``max_message_chars`` truncates each message's content."""
        out = asdict(self)
        out["messages"] = truncate_messages(self.messages, max_message_chars)
        out["input"], out["output"] = split_input_output(out["messages"])
        return out


def truncate_messages(messages: list[dict[str, Any]], max_chars: int | None) -> list[dict[str, Any]]:
    """Copy of ``messages`` with every content longer than ``max_chars`` cut in the middle.

    Head and tail are kept because the system prompt's head and an observation's tail are the
    informative parts; ``None`` or ``0`` keeps everything.
    """
    if not max_chars:
        return [dict(m) for m in messages]
    if max_chars < 16:
        raise ValueError(f"max_message_chars={max_chars} is too small; use 0 (no limit) or >= 16")
    out = []
    for m in messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, str) and len(content) > max_chars:
            head = max_chars // 2
            tail = max_chars - head
            cut = len(content) - max_chars
            m["content"] = content[:head] + _TRUNCATION_MARK.format(n=cut) + content[-tail:]
        out.append(m)
    return out


def split_input_output(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The release's ``input`` (system + first user text) and ``output`` (the rest) strings."""
    return ("\n".join(str(m.get("content", "")) for m in messages[:2]),
            "\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" for m in messages[2:]))


class ValidationLogWriter:
    """Appends records to ``<log_dir>/<step>.jsonl``; safe to share between threads.

    Each record is written as one line and flushed at once, so an interrupted run leaves at
    most one partial trailing line, which the reader skips (and ``seal eval --resume`` redoes).
    """

    def __init__(self, log_dir: str | Path, *, max_message_chars: int | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.max_message_chars = max_message_chars
        self._lock = threading.Lock()

    def path_for(self, step: int) -> Path:
        return self.log_dir / f"{int(step)}.jsonl"

    def write(self, record: ValidationRecord) -> None:
        line = json.dumps(record.to_json_dict(max_message_chars=self.max_message_chars), ensure_ascii=False)
        path = self.path_for(record.step)
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            _repair_trailing_line(path)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()

    def write_many(self, records: Iterable[ValidationRecord]) -> None:
        for r in records:
            self.write(r)


def _repair_trailing_line(path: Path) -> None:
    """Terminate a partial last line left by a crash, so the next record starts on its own line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
    if last != b"\n":
        with path.open("ab") as fh:
            fh.write(b"\n")


def read_log_file(path: str | Path) -> list[dict[str, Any]]:
    """All well-formed records of one JSONL log; malformed lines are skipped with a warning."""
    path = Path(path)
    records: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                logger.warning("%s:%d: skipping a malformed line (%s)", path, lineno, exc)
                continue
            if not isinstance(obj, dict):
                logger.warning("%s:%d: skipping a line that is not a JSON object", path, lineno)
                continue
            records.append(obj)
    return records


def step_of_file(path: str | Path) -> int | None:
    """The validation step a log file holds (``12.jsonl`` -> 12), or None for other files."""
    m = _STEP_FILE.match(Path(path).name)
    return int(m.group(1)) if m else None


def read_log_dir(log_dir: str | Path) -> dict[int, list[dict[str, Any]]]:
    """``{step: records}`` for every ``<step>.jsonl`` in ``log_dir``, steps ascending."""
    log_dir = Path(log_dir)
    if log_dir.is_file():
        raise NotADirectoryError(f"{log_dir} is a file, not a folder; pass the folder that holds the "
                                 f"<step>.jsonl files (here: {log_dir.parent})")
    if not log_dir.is_dir():
        raise FileNotFoundError(f"validation log dir {log_dir} does not exist; pass the run's validation_log directory")
    steps: dict[int, list[dict[str, Any]]] = {}
    for p in log_dir.iterdir():
        step = step_of_file(p)
        if step is not None:
            steps[step] = read_log_file(p)
    return dict(sorted(steps.items()))


def record_score(record: dict[str, Any]) -> float:
    """The record's score: ``score``, else ``reward`` (the release wrote both)."""
    for key in ("score", "reward"):
        value = record.get(key)
        if value is not None:
            return float(value)
    raise KeyError(f"log record for task {record.get('task_id')!r} has neither 'score' nor 'reward'")


def is_pass(record: dict[str, Any]) -> bool:
    return record_score(record) >= PASS_THRESHOLD


def is_errored(record: dict[str, Any]) -> bool:
    """Whether the episode could not be run: its LLM or environment failed after the retries.

    The one definition every reader uses (pass rates, ``seal eval``, the statistics script),
    the trainers' fault exclusion written down: the episode runner marks ``env_fault`` /
    ``llm_fault``, and every log writer sets ``error`` only for such an episode (``seal eval``
    also for any other failure to run it). An errored episode says nothing about the model, so
    it is left out of the pass rates and counted apart; the release's lines have neither key.
    """
    return bool(record.get("error") or record.get("env_fault") or record.get("llm_fault"))


def finished_keys(path: str | Path) -> set[tuple[str, int]]:
    """``(task_id, repeat)`` pairs already logged without a runner error (for ``--resume``)."""
    path = Path(path)
    if not path.exists():
        return set()
    return {(str(r["task_id"]), int(r.get("repeat", 0))) for r in read_log_file(path)
            if "task_id" in r and not r.get("error")}
