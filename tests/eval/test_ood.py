"""Table 2 (OOD): score files in BFCL's and τ²-bench's own formats are read and averaged as the
harnesses do, the harness commands are composed as documented, absent prerequisites are skipped
with a reason, and make_tables.py writes Table 2 beside the paper's numbers (hand-counted)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from seal.eval import ood, paper_numbers
from seal.eval.logs import ValidationLogWriter, ValidationRecord

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "Qwen/Qwen3-4B-Instruct-2507-FC"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _bfcl_score(root: Path, category: str, correct: int, total: int) -> None:
    """A score file as bfcl-eval's save_eval_results writes it: header line, then the failures."""
    sub = ("agentic/memory/" + category.split("_", 1)[1]) if category.startswith("memory") else "agentic"
    path = root / "score" / REGISTRY.replace("/", "_") / sub / f"BFCL_v4_{category}_score.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"accuracy": correct / total, "correct_count": correct, "total_count": total}]
    lines += [{"id": f"{category}_{i}", "valid": False, "error": ["wrong answer"]} for i in range(total - correct)]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def _tau2(folder: Path, domain: str, rewards: dict[str, list[float | None]]) -> None:
    sims = [{"id": f"{t}-{k}", "task_id": t, "trial": k, "reward_info": None if r is None else {"reward": r}}
            for t, rs in rewards.items() for k, r in enumerate(rs)]
    path = folder / "tau2" / domain / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"info": {"num_trials": max(len(v) for v in rewards.values())}, "tasks": [],
                                "simulations": sims}))


def _full_folder(folder: Path, scale: int = 1) -> dict[str, float]:
    """Write every score file; return the Table 2 values counted by hand."""
    _bfcl_score(folder / "bfcl", "web_search_base", 1 * scale, 5 * scale)      # 20 %
    _bfcl_score(folder / "bfcl", "web_search_no_snippet", 0, 5 * scale)        # 0 %
    _bfcl_score(folder / "bfcl", "memory_kv", 3 * scale, 10 * scale)           # 30 %
    _bfcl_score(folder / "bfcl", "memory_vector", 1 * scale, 10 * scale)       # 10 %
    _bfcl_score(folder / "bfcl", "memory_rec_sum", 2 * scale, 10 * scale)      # 20 %
    _tau2(folder, "retail", {"r0": [1.0], "r1": [0.0], "r2": [1.0], "r3": [0.5]})  # 2 of 4
    _tau2(folder, "airline", {"a0": [1.0, 1.0], "a1": [1.0, 0.0]})                  # (1 + 1/2) / 2
    _tau2(folder, "telecom", {"t0": [1.0], "t1": [None], "t2": [0.9999999]})        # 2 of 3
    ws, mem = (20 + 0) / 2, (30 + 10 + 20) / 3
    retail, airline, telecom = 50.0, 75.0, 200 / 3
    return {"web_search": ws, "memory": mem, "v4_avg": (ws + mem) / 2, "retail": retail, "airline": airline,
            "telecom": telecom, "tau2_avg": (retail + airline + telecom) / 3}


def test_score_files_read_as_the_harnesses_count(tmp_path):
    truth = _full_folder(tmp_path)
    cells = ood.load_ood_dir(tmp_path)
    for col, value in truth.items():
        assert cells[col].value == pytest.approx(value), col
    assert cells["memory"].missing == () and cells["memory"].n == 30
    assert ood.read_tau2_results(tmp_path / "tau2" / "airline" / "results.json") == ood.Score(1.5, 2)


def test_missing_parts_are_listed_and_averages_need_all_columns(tmp_path):
    _bfcl_score(tmp_path / "bfcl", "memory_kv", 3, 10)
    _bfcl_score(tmp_path / "bfcl", "memory_rec_sum", 1, 10)
    _tau2(tmp_path, "retail", {"r0": [1.0], "r1": [0.0]})
    (tmp_path / ood.SKIPPED_FILE).write_text(json.dumps({"memory_vector": "not requested",
                                                         "web_search_base": "SERPAPI_API_KEY is not set"}))
    cells = ood.load_ood_dir(tmp_path)
    assert cells["memory"].value == pytest.approx(20.0) and cells["memory"].missing == ("memory_vector",)
    assert math.isnan(cells["web_search"].value) and math.isnan(cells["v4_avg"].value)
    assert cells["retail"].value == 50.0 and math.isnan(cells["airline"].value) and math.isnan(cells["tau2_avg"].value)
    rows = ood.table2_cells({"seal": tmp_path}, paper_numbers.TABLE2["qwen2.5-7b-instruct"], {})
    by_col = {r["column"]: r for r in rows}
    assert by_col["web_search"]["missing"] == ("web_search_base (SERPAPI_API_KEY is not set);web_search_no_snippet")


def test_malformed_score_files_name_the_file(tmp_path):
    bad = tmp_path / "BFCL_v4_memory_kv_score.json"
    bad.write_text('{"id": "memory_kv_0"}\n')
    with pytest.raises(ValueError, match="BFCL_v4_memory_kv_score.json"):
        ood.read_bfcl_score_file(bad)
    (tmp_path / "results.json").write_text('{"simulations": [{"trial": 0}]}')
    with pytest.raises(ValueError, match="results.json"):
        ood.read_tau2_results(tmp_path / "results.json")
    with pytest.raises(FileNotFoundError, match="ood_eval.py"):
        ood.load_ood_dir(tmp_path / "absent")


def test_commands_are_composed_as_the_harnesses_document(tmp_path):
    gen = ood.bfcl_generate("/v/bin/bfcl", registry=REGISTRY, categories=["memory_kv", "memory_rec_sum"],
                            model_path="/ckpt", endpoint="http://h:8000/v1/", api_key="k", project_root=tmp_path)
    assert gen.argv == ["/v/bin/bfcl", "generate", "--model", REGISTRY, "--test-category", "memory_kv,memory_rec_sum",
                        "--skip-server-setup", "--local-model-path", "/ckpt", "--num-threads", "8"]
    assert gen.env == {"BFCL_PROJECT_ROOT": str(tmp_path), "REMOTE_OPENAI_BASE_URL": "http://h:8000/v1",
                       "REMOTE_OPENAI_API_KEY": "k", "REMOTE_OPENAI_TOKENIZER_PATH": "/ckpt"}
    ev = ood.bfcl_evaluate("bfcl", registry=REGISTRY, categories=["memory_kv"], project_root=tmp_path)
    assert ev.argv[1:] == ["evaluate", "--model", REGISTRY, "--test-category", "memory_kv", "--partial-eval"]
    run = ood.tau2_run("tau2", domain="airline", served_model="/ckpt", endpoint="http://h:8000/v1", api_key="k",
                       user_llm=ood.TAU2_DEFAULT_USER_LLM, user_llm_args=None, save_to="s", repo=tmp_path)
    a = run.argv
    assert a[:4] == ["tau2", "run", "--domain", "airline"] and a[a.index("--agent-llm") + 1] == "openai//ckpt"
    assert json.loads(a[a.index("--agent-llm-args") + 1]) == {"api_base": "http://h:8000/v1", "api_key": "k",
                                                              "temperature": 0.0}
    assert a[a.index("--user-llm") + 1] == "gpt-4.1-2025-04-14" and "--user-llm-args" not in a
    assert a[a.index("--seed") + 1] == "300" and a[a.index("--num-trials") + 1] == "1" and run.cwd == tmp_path
    with pytest.raises(ValueError, match="mock"):
        ood.tau2_run("tau2", domain="mock", served_model="m", endpoint="e", api_key="k", user_llm="u",
                     user_llm_args=None, save_to="s", repo=tmp_path)
    (tmp_path / "data" / "simulations").mkdir(parents=True)
    assert ood.tau2_results_path(tmp_path, "s") is None
    (tmp_path / "data" / "simulations" / "s.json").write_text("{}")
    assert ood.tau2_results_path(tmp_path, "s") == tmp_path / "data" / "simulations" / "s.json"


def test_skip_reasons():
    assert "SERPAPI_API_KEY" in ood.web_search_skip_reason({}, online=True)
    assert "internet" in ood.web_search_skip_reason({"SERPAPI_API_KEY": "x"}, online=False)
    assert ood.web_search_skip_reason({"SERPAPI_API_KEY": "x"}, online=True) is None
    tools = {"git": True, "uv": True}
    kw = dict(user_llm=ood.TAU2_DEFAULT_USER_LLM, user_llm_args=None, tools=tools)
    assert "OPENAI_API_KEY" in ood.tau2_skip_reason({}, online=True, have_repo=True, **kw)
    assert "clone" in ood.tau2_skip_reason({"OPENAI_API_KEY": "x"}, online=False, have_repo=False, **kw)
    assert ood.tau2_skip_reason({"OPENAI_API_KEY": "x"}, online=True, have_repo=False, **kw) is None
    assert "uv" in ood.tau2_skip_reason({}, online=True, have_repo=True, user_llm="u", user_llm_args=None,
                                        tools={"git": True, "uv": False})
    # A local user simulator needs neither a key nor the internet once the repository is there.
    assert ood.tau2_skip_reason({}, online=False, have_repo=True, user_llm="openai/qwen",
                                user_llm_args={"api_base": "http://127.0.0.1:8001/v1"}, tools=tools) is None


def test_script_skips_what_cannot_run_here(tmp_path, monkeypatch, capsys):
    for var in ("SERPAPI_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    script = _load("ood_eval")
    monkeypatch.setattr(script.ood, "can_connect", lambda host, port=443, timeout=3.0: False)
    out = tmp_path / "ood"
    assert script.main(["--endpoint", "http://127.0.0.1:9/v1", "--model-path", str(tmp_path), "--out", str(out),
                        "--parts", "web_search,retail,airline"]) == 0
    skipped = json.loads((out / ood.SKIPPED_FILE).read_text())
    assert skipped["web_search_base"].startswith("SERPAPI_API_KEY is not set")
    assert set(skipped) >= {"web_search_no_snippet", "retail", "airline", "telecom", "memory_kv"}
    assert skipped["telecom"] == "not requested (--parts)"
    printed = capsys.readouterr().out
    assert "skipped retail:" in printed and "skipped web_search_base: SERPAPI_API_KEY is not set" in printed


def _val_run(root: Path) -> None:
    w = ValidationLogWriter(root / "validation_log")
    for c in ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"):
        w.write(ValidationRecord(task_id=f"{c}_1", data_source=c, split="test", step=0, score=1.0, reward=1.0,
                                 valid=True, tags=["pass"]))


def test_make_tables_writes_table2_beside_the_paper(tmp_path):
    truth = {"backbone": _full_folder(tmp_path / "ood_base"), "seal": _full_folder(tmp_path / "ood_seal", 2)}
    _val_run(tmp_path / "run")
    out = tmp_path / "report"
    assert _load("make_tables").main(["--run", f"seal={tmp_path / 'run'}", "--out", str(out),
                                      "--backbone", "qwen2.5-3b-instruct",
                                      "--ood", f"backbone={tmp_path / 'ood_base'}",
                                      "--ood", f"seal={tmp_path / 'ood_seal'}"]) == 0
    rows = {(r["row"], r["column"]): r for r in csv.DictReader((out / "table2.csv").open())}
    ref = paper_numbers.TABLE2["qwen2.5-3b-instruct"]
    for row in ("backbone", "seal"):
        for col in paper_numbers.TABLE2_COLUMNS:
            r = rows[(row, col)]
            assert float(r["ours"]) == pytest.approx(truth[row][col], abs=1e-4), (row, col)
            assert float(r["paper"]) == ref[row][col]
            assert float(r["diff"]) == pytest.approx(truth[row][col] - ref[row][col], abs=1e-4)
    md = (out / "table2.md").read_text()
    assert "| + SEAL (full) | 15.00 (paper 8.63, Δ +6.37) | 10.00 (paper 2.00, Δ +8.00) |" in md
    assert (out / "table1.md").is_file() and (out / "table3.md").is_file()
