"""scripts/episode_snapshot.py: the scripted episodes it plays, what it records, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "episode_snapshot.py"


def _snapshot(tmp_path: Path, name: str, *args: str) -> list[dict]:
    out = tmp_path / name
    done = subprocess.run([sys.executable, str(SCRIPT), "--limit", "2", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_snapshot_is_deterministic_and_tells_the_perturbations_apart(tmp_path):
    rows = _snapshot(tmp_path, "a.jsonl")
    _snapshot(tmp_path, "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    variants = {"oracle", "skip_first", "unknown_function", "malformed_call", "duplicate_call", "drop_last_call"}
    assert len(rows) == 2 * len(variants) * 2 and {r["variant"] for r in rows} == variants
    by = {(r["task"], r["variant"], r["mode"]): r for r in rows}
    for task in {r["task"] for r in rows}:
        for mode in ("sample", "validate"):
            oracle, skipped = by[task, "oracle", mode], by[task, "skip_first", mode]
            assert oracle["valid"] is True and set(oracle["tags"]) <= {"pass", "correct_abstention"}
            assert oracle["apatch_scale"] == 1.0  # a passing episode is not reweighted
            assert skipped["valid"] is False and "empty_turn_model_response" in skipped["tags"]
            assert skipped["apatch_scale"] != 1.0
            assert by[task, "malformed_call", mode]["observations_sha256"] != oracle["observations_sha256"]


def test_a_tree_that_is_not_this_project_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--tree", str(tmp_path), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a checkout of this project" in done.stderr
