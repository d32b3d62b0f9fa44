"""Scripts under scripts/ turn expected failures (missing files, a file given for a folder, bad
flags) into one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *argv], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


@pytest.mark.parametrize("script, argv, line", [
    ("prepare_model.py", ["--gguf", "{tmp}/nope.gguf", "--out", "{tmp}/m"], "prepare_model: --gguf {tmp}/nope.gguf: no such file"),
    ("prepare_model.py", ["--out", "{tmp}/file.txt"], "prepare_model: --out {tmp}/file.txt is a file; give a folder for the checkpoint"),
    ("bench_rollout.py", ["--model", "{tmp}/nope"], "bench_rollout: --model {tmp}/nope: no such model folder "
                                                   "(run install.sh or scripts/prepare_model.py)"),
    ("stats_validation_bfcl.py", ["--val-dir", "{tmp}", "--parquet", "{tmp}/x.parquet"],
     "stats_validation_bfcl: --parquet {tmp}/x.parquet: no such file"),
])
def test_one_line_and_non_zero_exit(tmp_path, script, argv, line):
    (tmp_path / "file.txt").write_text("x")
    proc = _run(script, *(a.format(tmp=tmp_path) for a in argv))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == line.format(tmp=tmp_path)
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1
