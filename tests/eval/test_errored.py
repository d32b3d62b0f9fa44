"""An episode that could not be run (LLM or environment failure) is never scored as a model
failure: one definition (``is_errored``) used by the pass counts, ``seal eval``, the statistics
script and the local trainer's validation metrics; the commands fail in one line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, HTTPException

from seal.cli import main as seal_main
from seal.eval import logs
from seal.eval.logs import read_log_file
from seal.eval.stats import OVERALL, pass_counts

ROOT = Path(__file__).resolve().parents[2]
STATS = ROOT / "scripts" / "stats_validation_bfcl.py"
TASKS = ["multi_turn_base_120", "multi_turn_base_29"]


def _rec(task: str, score: float, **extra) -> dict:
    return {"task_id": task, "data_source": task.rsplit("_", 1)[0], "score": score, **extra}


def test_errored_records_are_counted_apart_from_the_pass_rate():
    records = [
        _rec("multi_turn_base_1", 1.0), _rec("multi_turn_base_2", 0.0),
        _rec("multi_turn_base_3", 0.0, error="LLM fault: connection refused"),
        _rec("multi_turn_miss_func_1", 0.0, env_fault=True),
        _rec("multi_turn_miss_func_2", 0.0, llm_fault=True),
    ]
    assert [logs.is_errored(r) for r in records] == [False, False, True, True, True]
    counts = pass_counts(records)
    assert (counts["multi_turn_base"].n_pass, counts["multi_turn_base"].n, counts["multi_turn_base"].errored) == (1, 2, 1)
    assert counts["multi_turn_miss_func"].n == 0 and counts["multi_turn_miss_func"].errored == 2
    assert (counts[OVERALL].n_pass, counts[OVERALL].n, counts[OVERALL].errored) == (1, 2, 3)
    assert counts["multi_turn_base"].cell() == "50.00 (1/2) +1 errored"
    # The release's lines carry neither key: nothing is errored.
    assert not logs.is_errored({"task_id": "multi_turn_base_1", "score": 0.0, "input": "", "output": ""})


def test_local_validation_metrics_leave_faults_out():
    from seal.episode import EpisodeResult, Evaluation
    from seal.trainer.local.episodes import Episode
    from seal.trainer.local.validation import validation_metrics

    passed = Evaluation.from_wire({"valid": True, "failure_tags": ["pass"]})
    eps = [Episode(EpisodeResult("multi_turn_base_1", "multi_turn_base", evaluation=passed), "u1", 0),
           Episode(EpisodeResult("multi_turn_base_2", "multi_turn_base", env_fault=True), "u2", 0),
           Episode(EpisodeResult("multi_turn_base_3", "multi_turn_base", llm_fault=True), "u3", 0)]
    metrics = validation_metrics(eps)
    assert metrics["val/pass_rate"] == 1.0 and metrics["val/faults"] == 2.0


@pytest.fixture
def failing_endpoint():
    """An OpenAI-compatible server that answers /models but fails every chat request (503)."""
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {"data": [{"id": "broken"}]}

    @app.post("/v1/chat/completions")
    def chat() -> dict:
        raise HTTPException(503, "overloaded")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "stub server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


def test_failing_endpoint_is_errored_not_a_zero_score(tmp_path, failing_endpoint, capsys):
    out = tmp_path / "eval"
    args = ["eval", "--endpoint", failing_endpoint, "--served-model", "broken", "--tasks", ",".join(TASKS),
            "--max-retries", "0", "--out", str(out), "--no-progress"]
    assert seal_main(args) == 3
    captured = capsys.readouterr()
    assert "[2 errored: not run to the end" in captured.out
    assert "100.0% of the tasks could not be run" in captured.err
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["repeats"][0]["counts"][OVERALL] == {"n_pass": 0, "n": 0, "errored": 2}
    assert all(logs.is_errored(r) for r in read_log_file(out / "validation_log" / "0.jsonl"))
    # The statistics script reports them apart, not as 0/2.
    from importlib import util

    spec = util.spec_from_file_location("stats_script", STATS)
    stats = util.module_from_spec(spec)
    spec.loader.exec_module(stats)
    assert stats.main(["--val-dir", str(out / "validation_log")]) == 0
    text = capsys.readouterr().out
    assert "- (2 errored)" in text and "step 0: 2 errored episodes" in text and "0/2" not in text
    # A documented threshold lets a run with some errored tasks pass.
    assert seal_main([*args, "--fresh", "--max-errored-frac", "1.0"]) == 0


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_unreachable_endpoint_fails_at_once_in_one_line(tmp_path):
    proc = _cli("-m", "seal.cli", "eval", "--endpoint", "http://127.0.0.1:1/v1", "--served-model", "m",
                "--tasks", TASKS[0], "--out", str(tmp_path / "e"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "seal eval: --endpoint http://127.0.0.1:1/v1: nothing answers there (ConnectError: [Errno 111] "
        "Connection refused); start the server or fix the URL"]
    assert not (tmp_path / "e").exists()


def test_missing_log_for_export_is_one_line(tmp_path):
    proc = _cli("-m", "seal.cli", "export-bfcl", "--log", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("seal export-bfcl: FileNotFoundError:") and "nope.jsonl" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_stats_script_missing_folder_and_file_given_for_a_folder(tmp_path):
    proc = _cli(str(STATS), "--val-dir", str(tmp_path / "missing"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"stats_validation_bfcl: validation log dir {tmp_path / 'missing'} does not exist; pass the run's "
        "validation_log directory"]
    log = tmp_path / "0.jsonl"
    log.write_text(json.dumps(_rec("multi_turn_base_1", 1.0)) + "\n")
    proc = _cli(str(STATS), "--val-dir", str(log))
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"stats_validation_bfcl: {log} is a file, not a folder; pass the folder that holds the <step>.jsonl "
        f"files (here: {tmp_path})"]


def test_make_tables_missing_run_is_one_line(tmp_path):
    proc = _cli(str(ROOT / "scripts" / "make_tables.py"), "--run", f"a={tmp_path / 'nope'}", "--out",
                str(tmp_path / "t"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"make_tables: {tmp_path / 'nope'}: no such folder; pass an "
                                                 "experiment folder (experiments/<name>)"]
