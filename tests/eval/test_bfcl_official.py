"""The official ``bfcl evaluate`` agrees with our verdicts on exported oracle and perturbed
trajectories. Needs the throwaway CLI venv that ``scripts/bfcl_official_eval.sh`` creates under
``.bench/bfcl-official/``; skipped when it is absent (it is never a project dependency)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from seal.eval.export import export_records, read_bfcl_scores
from seal.eval.roundtrip import compare, roundtrip_records

ROOT = Path(__file__).resolve().parents[2]
BFCL = ROOT / ".bench" / "bfcl-official" / "venv" / "bin" / "bfcl"


@pytest.mark.slow
@pytest.mark.skipif(not (BFCL.parent.parent / ".ready").exists(), reason="run scripts/bfcl_official_eval.sh once")
def test_official_scorer_agrees(tmp_path):
    records = [r.to_json_dict() for r in roundtrip_records(per_category=5, seed=3)]
    assert any(r["valid"] for r in records) and not all(r["valid"] for r in records)
    export_records(records, tmp_path)
    env = {**os.environ, "BFCL_PROJECT_ROOT": str(tmp_path), "OPENAI_API_KEY": "dummy"}
    out = subprocess.run([str(BFCL), "evaluate", "--model", "gpt-4o-2024-11-20-FC", "--test-category", "multi_turn",
                          "--partial-eval"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    official = read_bfcl_scores(tmp_path, [r["task_id"] for r in records])
    assert compare(records, official) == []
