"""make_tables.py: numbers equal direct counts, paper numbers sit next to them, plots get written."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from seal.eval import paper_numbers
from seal.eval.logs import ValidationLogWriter, ValidationRecord

ROOT = Path(__file__).resolve().parents[2]
CATS = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


def _script():
    spec = importlib.util.spec_from_file_location("make_tables", ROOT / "scripts" / "make_tables.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the script loads
    spec.loader.exec_module(mod)
    return mod


def _make_run(root: Path, rng: random.Random, p_pass: float, steps=(0, 10), repeats: int = 1,
              training: bool = False) -> dict:
    """Write a run; return {(repeat, step): {cat: [n_pass, n]}} as the reference count."""
    truth = {}
    for r in range(repeats):
        base = root if repeats == 1 else root / f"repeat_{r}"
        w = ValidationLogWriter(base / "validation_log")
        for step in steps:
            counts = {c: [0, 0] for c in CATS}
            for c in CATS:
                for i in range(10):
                    ok = rng.random() < p_pass + 0.02 * step
                    counts[c][0] += ok
                    counts[c][1] += 1
                    w.write(ValidationRecord(task_id=f"{c}_{i}", data_source=c, split="val" if i < 3 else "test",
                                             step=step, score=float(ok), reward=float(ok), valid=ok,
                                             tags=["pass"] if ok else ["state_mismatch", "empty_turn_model_response"]))
            truth[(r, step)] = counts
    if training:
        (root / "diagnostic_stats").mkdir()
        for e, step in enumerate(steps):
            (root / "diagnostic_stats" / f"epoch_{e}.json").write_text(json.dumps({
                "epoch": e, "global_step": step,
                "tags": {"pass": {"count": 5 + step}, "state_mismatch": {"count": 10}},
                "dynamic_tag_weights": {"state_mismatch": 1.0 + 0.01 * step, "pass": 1.0}}))
        with (root / "metrics.jsonl").open("w") as fh:
            for s in range(0, max(steps) + 1):
                fh.write(json.dumps({"step": s, "seal/reward_mean": 0.1 + 0.01 * s,
                                     "seal/diagnosis/dynamic_tag_weight/spurious_tool_call": 2.0 - 0.01 * s}) + "\n")
    return truth


def _rate(counts: dict, cat: str) -> float:
    return 100 * counts[cat][0] / counts[cat][1]


def test_tables_match_direct_counts_and_paper(tmp_path):
    rng = random.Random(11)
    t_base = _make_run(tmp_path / "backbone", rng, 0.1)
    t_seal = _make_run(tmp_path / "seal", rng, 0.4, training=True)
    out = tmp_path / "report"
    assert _script().main(["--run", f"backbone={tmp_path / 'backbone'}", "--run", f"seal={tmp_path / 'seal'}",
                           "--out", str(out)]) == 0
    rows = {(r["row"], r["column"]): r for r in csv.DictReader((out / "table1.csv").open())}
    last_seal, last_base = t_seal[(0, 10)], t_base[(0, 10)]
    for cat in CATS:
        assert float(rows[("seal", cat)]["ours"]) == pytest.approx(_rate(last_seal, cat))
        assert float(rows[("seal", cat)]["paper"]) == paper_numbers.TABLE1["qwen2.5-7b-instruct"]["seal"][cat]
        assert float(rows[("seal", cat)]["diff"]) == pytest.approx(
            _rate(last_seal, cat) - paper_numbers.TABLE1["qwen2.5-7b-instruct"]["seal"][cat])
    avg_seal = sum(_rate(last_seal, c) for c in CATS) / 4
    avg_base = sum(_rate(last_base, c) for c in CATS) / 4
    assert float(rows[("seal", "avg")]["ours"]) == pytest.approx(avg_seal)
    assert float(rows[("seal", "avg")]["gain"]) == pytest.approx(avg_seal - avg_base)
    assert rows[("vanilla_rl", "avg")]["ours"] == ""  # not run: no number invented
    md = (out / "table1.md").read_text()
    assert "(not run)" in md and f"{avg_seal:.2f} (paper 40.25" in md
    t3 = (out / "table3.md").read_text()
    assert "w/o Closed-Loop Update (not run)" in t3
    for png in ("pass_rate_over_steps.png", "tag_fractions.png", "apatch_weights.png", "reward_curve.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG", png


def test_repeats_split_and_step_selection(tmp_path):
    rng = random.Random(5)
    truth = _make_run(tmp_path / "seal", rng, 0.3, steps=(0, 5), repeats=3)
    mod = _script()
    run = mod.load_run("seal", tmp_path / "seal", "all")
    assert run.repeats == 3
    rates = [_rate(truth[(r, 5)], "multi_turn_base") for r in range(3)]
    mean = sum(rates) / 3
    std = (sum((x - mean) ** 2 for x in rates) / 2) ** 0.5
    assert run.at(5)["multi_turn_base"] == pytest.approx((mean, std))
    val = mod.load_run("seal", tmp_path / "seal", "val")
    assert val.n[5]["multi_turn_base"] == 3 and val.n[5]["overall"] == 12
    assert mod.pick_step(run, "0") == 0 and mod.pick_step(run, "last") == 5
    assert mod.pick_step(run, "best") == max(run.steps, key=lambda s: run.steps[s]["avg"][0])
    with pytest.raises(ValueError, match="no validation step 7"):
        mod.pick_step(run, "7")
    with pytest.raises(SystemExit, match="NAME=DIR"):
        mod.parse_runs(["seal"])
