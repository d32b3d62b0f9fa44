"""Capability state: buckets, tasks, dominant tag, persistence (atomic, versioned, strict)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seal.diagnosis import CapabilityState, CapabilityStateError, dominant_tag, turn_position
from seal_shared.types import UNKNOWN_TAG, FailureTag

T = FailureTag
CAT = "multi_turn_base"


def _filled() -> CapabilityState:
    s = CapabilityState()
    s.observe(CAT, "multi_turn_base_1", 0.0, False, [T.PASS, T.STATE_MISMATCH, T.STATE_MISMATCH], epoch=0, step=1)
    s.observe(CAT, "multi_turn_base_1", 1.0, True, [T.PASS, T.PASS, T.PASS], epoch=0, step=2)
    s.observe("multi_turn_miss_func", "multi_turn_miss_func_3", 0.5, False, [], epoch=1, step=3)
    return s


def test_dominant_tag_rule() -> None:
    assert dominant_tag([T.PASS, T.STATE_MISMATCH, T.RESPONSE_MISMATCH, T.RESPONSE_MISMATCH]) == "response_mismatch"
    assert dominant_tag([T.STATE_MISMATCH, T.RESPONSE_MISMATCH]) == "state_mismatch"  # tie: first seen
    assert dominant_tag([T.PASS, T.PASS]) == "pass"
    assert dominant_tag([]) == UNKNOWN_TAG


def test_turn_position_buckets() -> None:
    assert turn_position(0, 1) == "only"
    assert [turn_position(i, 3) for i in range(3)] == ["early", "middle", "late"]
    assert [turn_position(i, 6) for i in range(6)] == ["early", "early", "middle", "middle", "late", "late"]


def test_observe_counts_every_bucket() -> None:
    s = _filled()
    for scope in (s.window, s.total):
        base = scope["categories"][CAT]
        assert (base.count, base.success, base.reward_sum) == (2, 1, 1.0)
        sm = scope["tags"]["state_mismatch"]
        assert (sm.count, sm.success, sm.reward_sum) == (2, 0, 0.0)  # one episode, two occurrences
        assert scope["tags"]["pass"].count == 4 and scope["tags"]["pass"].success == 3
        assert scope["tags"][UNKNOWN_TAG].partial_count == 1  # empty tags recorded as unknown; 0 < 0.5 < 1
        assert scope["category_tags"][f"{CAT}::state_mismatch"].count == 2
        assert scope["turn_positions"]["middle::state_mismatch"].count == 1
        assert scope["turn_positions"]["late::state_mismatch"].count == 1
        assert scope["turn_positions"][f"only::{UNKNOWN_TAG}"].count == 1
    task = s.tasks["multi_turn_base_1"]
    assert task["count"] == 2 and task["success"] == 1 and task["reward_sum"] == 1.0
    assert task["last_reward"] == 1.0 and task["last_success"] is True and task["last_tag"] == "pass"
    assert task["tag_counts"] == {"pass": 4, "state_mismatch": 2} and task["last_step"] == 2
    assert (s.observe_count, s.last_epoch, s.last_step) == (3, 1, 3)


def test_reset_window_keeps_totals_and_tag_source_falls_back() -> None:
    s = _filled()
    assert s.tag_source()["state_mismatch"].count == 2
    s.reset_window()
    assert all(not b for b in s.window.values())
    assert s.total["tags"]["state_mismatch"].count == 2
    assert s.tag_source()["state_mismatch"].count == 2  # window empty -> totals
    s.observe(CAT, "multi_turn_base_2", 1.0, True, [T.PASS], epoch=2, step=4)
    assert set(s.tag_source()) == {"pass"}
    assert set(s.tag_source(category="multi_turn_miss_func")) == {UNKNOWN_TAG}  # window lacks it -> totals


def test_snapshot_has_rates() -> None:
    snap = _filled().snapshot(window=True)
    assert snap["scope"] == "window"
    assert snap["categories"][CAT]["success_rate"] == 0.5
    assert snap["tags"]["pass"]["reward_mean"] == pytest.approx(0.75)
    assert snap["tasks"]["multi_turn_miss_func_3"]["last_tag"] == UNKNOWN_TAG


def test_the_state_holds_only_the_diagnosis(tmp_path: Path) -> None:
    """A reweighter's weights are its own state; a file that still carries them loads without them."""
    s = _filled()
    assert "dynamic_tag_weights" not in s.to_dict()
    s.save(tmp_path / "st.json")
    data = json.loads((tmp_path / "st.json").read_text())
    (tmp_path / "old.json").write_text(json.dumps({**data, "dynamic_tag_weights": {"pass": 1.0}}))
    assert CapabilityState.load(tmp_path / "old.json").to_dict() == s.to_dict()


def test_round_trip_identical(tmp_path: Path) -> None:
    s = _filled()
    path = tmp_path / "sub" / "capability_state.json"
    s.save(path)
    loaded = CapabilityState.load(path)
    assert loaded.to_dict() == s.to_dict()
    assert json.loads(path.read_text())["version"] == 1
    assert CapabilityState.from_dict(s.to_dict()).to_dict() == s.to_dict()
    assert [p.name for p in path.parent.iterdir()] == ["capability_state.json"]  # no temp files left


def test_window_survives_save_before_reset(tmp_path: Path) -> None:
    """The epoch-end order the trainer uses: dump/save, then reset (the release saved after)."""
    s = _filled()
    s.save(tmp_path / "s.json")
    s.reset_window()
    assert CapabilityState.load(tmp_path / "s.json").window["tags"]["state_mismatch"].count == 2


def test_load_is_strict(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        CapabilityState.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "total_tags": ')
    with pytest.raises(CapabilityStateError, match="not valid JSON"):
        CapabilityState.load(bad)
    other = _filled().to_dict() | {"version": 2}
    bad.write_text(json.dumps(other))
    with pytest.raises(CapabilityStateError, match="version 2"):
        CapabilityState.load(bad)
    broken = _filled().to_dict()
    del broken["tasks"]
    bad.write_text(json.dumps(broken))
    with pytest.raises(CapabilityStateError, match="malformed"):
        CapabilityState.load(bad)


def test_failed_save_leaves_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.json"
    CapabilityState().save(path)
    before = path.read_bytes()

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        _filled().save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


_CHILD = r"""
import os, sys, time
from seal.diagnosis import CapabilityState
from seal_shared.types import FailureTag
marker = sys.argv[2]
real_fsync = os.fsync
def slow_fsync(fd):
    # The new content is written but not yet renamed into place: signal, then hang.
    open(marker, "w").close()
    time.sleep(60)
os.fsync = slow_fsync
s = CapabilityState()
for i in range(200):
    s.observe("multi_turn_base", f"multi_turn_base_{i}", 0.0, False, [FailureTag.STATE_MISMATCH] * 3, epoch=0, step=i)
s.save(sys.argv[1])
"""


def test_kill_during_save_leaves_previous_file_intact(tmp_path: Path) -> None:
    path, marker = tmp_path / "s.json", tmp_path / "in_fsync"
    old = _filled()
    old.save(path)
    before = path.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(marker)])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None, "child exited before reaching fsync"
            assert time.monotonic() < deadline, "child never reached fsync"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert path.read_bytes() == before
    assert CapabilityState.load(path).to_dict() == old.to_dict()
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the torn write went to a temp file
