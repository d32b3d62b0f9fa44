"""scripts/pooled_gain.py: RL's gain against a baseline pooled from several validations."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from seal.config import REPO_ROOT

_spec = importlib.util.spec_from_file_location("pooled_gain", REPO_ROOT / "scripts" / "pooled_gain.py")
pooled = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pooled)

TASKS = [f"t{i:02d}" for i in range(20)]


def _log(path: Path, passes: dict[str, list[int]]) -> Path:
    path.write_text("".join(json.dumps({"task_id": t, "score": float(s)}) + "\n" for t, ss in passes.items() for s in ss))
    return path


def test_a_real_gain_is_seen_and_no_change_is_not():
    before = {t: [1.0 if (i + k) % 5 == 0 else 0.0 for k in range(6)] for i, t in enumerate(TASKS)}  # ~0.2
    better = [{t: [1.0 if (i + k + s) % 5 < 3 else 0.0 for k in range(2)] for i, t in enumerate(TASKS)} for s in range(3)]
    gain, low, high = pooled.pooled_gain(before, better, draws=2000)
    assert 0.3 < gain < 0.5 and low > 0.1 and high < 0.7
    same = [{t: [1.0 if (i + k + s) % 5 == 0 else 0.0 for k in range(2)] for i, t in enumerate(TASKS)} for s in range(3)]
    gain, low, high = pooled.pooled_gain(before, same, draws=2000)
    assert abs(gain) < 0.05 and low < 0 < high


def test_the_baseline_noise_widens_the_interval():
    """Two baselines with the same pass rate on every task, of 2 and of 12 episodes a task: the
    thinner one gives the wider interval (a bootstrap that took the baseline's means as exact
    would give both the same)."""
    after = [{t: [1.0 if (i + s) % 3 == 0 else 0.0 for _ in range(2)] for i, t in enumerate(TASKS)} for s in range(3)]
    thin = {t: [0.0, 1.0] for t in TASKS}
    thick = {t: [0.0, 1.0] * 6 for t in TASKS}
    _, lo_thin, hi_thin = pooled.pooled_gain(thin, after, draws=2000)
    _, lo_thick, hi_thick = pooled.pooled_gain(thick, after, draws=2000)
    assert hi_thin - lo_thin > 1.2 * (hi_thick - lo_thick)


def test_the_cli_reads_logs_and_refuses_a_task_missing_after(tmp_path, capsys):
    b1 = _log(tmp_path / "b1.jsonl", {t: [0, 1] for t in TASKS})
    b2 = _log(tmp_path / "b2.jsonl", {t: [0, 0] for t in TASKS})
    a = [_log(tmp_path / f"a{s}.jsonl", {t: [1, 1] for t in TASKS}) for s in range(2)]
    assert pooled.main(["--before", str(b1), str(b2), "--after", *map(str, a), "--draws", "500"]) == 0
    out = capsys.readouterr().out
    assert "before: 0.250 over 80 episodes of 20 tasks (2 logs)" in out and "gain: +0.750" in out
    short = _log(tmp_path / "short.jsonl", {t: [1] for t in TASKS[:-1]})
    assert pooled.main(["--before", str(b1), "--after", str(short)]) == 1
    assert "task t19 has a baseline but no episode after training" in capsys.readouterr().err
    assert pooled.main(["--before", str(tmp_path / "nope.jsonl"), "--after", str(short)]) == 1
