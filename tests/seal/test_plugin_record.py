"""A run records its plug-ins' code: ``seal.plugins.plugin_record`` and launcher's ``plugins.json``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import launcher
from seal.plugins import child_environment, import_root, plugin_record


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "src"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m.split(".")[0] in ("rec_mod", "rec_pkg")]:
        sys.modules.pop(name)


def test_a_module_outside_git_has_its_hash_and_no_commit(on_path: Path) -> None:
    source = _write(on_path / "rec_mod.py", "X = 1\n")
    record = plugin_record("rec_mod")
    assert record["file"] == str(source.resolve()) and record["files"] == 1
    assert record["sha256"] == hashlib.sha256(b"rec_mod.py\0X = 1\n\0").hexdigest()
    assert record["git_commit"] is None and record["git_dirty"] is None
    assert import_root("rec_mod") == on_path.resolve()


def test_a_package_hashes_every_submodule_and_names_its_commit(on_path: Path) -> None:
    _write(on_path / "rec_pkg" / "__init__.py", "from rec_pkg import tools\n")
    tools = _write(on_path / "rec_pkg" / "tools.py", "Y = 2\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=on_path, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=on_path, capture_output=True, text=True).stdout.strip()
    first = plugin_record("rec_pkg")
    assert first["files"] == 2 and first["git_commit"] == head and first["git_dirty"] is False
    tools.write_text("Y = 3\n", encoding="utf-8")
    second = plugin_record("rec_pkg")
    assert second["sha256"] != first["sha256"] and second["git_dirty"] is True  # a submodule changed
    assert import_root("rec_pkg") == on_path.resolve()


def test_child_environment_puts_the_import_folders_first(on_path: Path) -> None:
    _write(on_path / "rec_mod.py", "X = 1\n")
    env = child_environment(["rec_mod"], {"PYTHONPATH": os.pathsep.join(["/elsewhere", str(on_path.resolve())])})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(on_path.resolve()), "/elsewhere"]


def test_plugins_json_beside_git_commit(on_path: Path, tmp_path: Path) -> None:
    _write(on_path / "rec_mod.py", "X = 1\n")
    exp = tmp_path / "exp"
    exp.mkdir()
    launcher.write_plugin_record(exp, ["rec_mod"])
    (record,) = json.loads((exp / "plugins.json").read_text())
    assert record["module"] == "rec_mod" and len(record["sha256"]) == 64
    launcher.write_plugin_record(exp, [])
    assert not (exp / "plugins.json").exists()  # a rerun without plug-ins leaves no stale record
