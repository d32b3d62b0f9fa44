"""A run's research plug-ins: modules that register failure tags, reweighters or environments on import.

``seal.plugins`` lists them by module name; the config check and the trainers' co-evolution step import them
(:func:`load_plugins`, shared with the environment service) before anything reads the registries. The
environment service imports the same modules with ``--plugin`` in every process; the service the launcher
starts gets each one, and the folders they came from on its ``PYTHONPATH`` (:func:`child_environment`). A
run records its plug-ins' code beside ``git_commit.txt`` (:func:`plugin_record`): each module's file hash
and its repository's commit.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from seal_shared.plugins import load_plugins

__all__ = ["child_environment", "git_output", "import_root", "load_plugins", "plugin_record"]


def _module_file(name: str) -> Path | None:
    module = sys.modules.get(name) or importlib.import_module(name)
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def import_root(name: str) -> Path | None:
    """The folder on ``sys.path`` that module ``name`` was imported from (``None``: no file)."""
    file = _module_file(name)
    if file is None:
        return None
    levels = name.count(".") + (1 if file.name == "__init__.py" else 0)
    return file.parents[levels]


def child_environment(modules: Iterable[str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with the plug-ins' import folders first on ``PYTHONPATH``,
    so a child process (the environment service) imports the same modules this process did."""
    env = dict(os.environ if base is None else base)
    roots = [str(r) for r in dict.fromkeys(import_root(m) for m in modules) if r is not None]
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in roots]
    if roots or rest:
        env["PYTHONPATH"] = os.pathsep.join(roots + rest)
    return env


def _source_files(file: Path) -> list[Path]:
    """A module's file, or every ``.py`` file of a package (its code may live in submodules)."""
    if file.name != "__init__.py":
        return [file]
    return sorted(p for p in file.parent.rglob("*.py") if "__pycache__" not in p.parts)


def git_output(folder: Path, *args: str) -> str | None:
    """The stripped output of ``git -C folder args...`` (None when git fails or is missing)."""
    try:
        out = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def plugin_record(name: str) -> dict[str, Any]:
    """What identifies one plug-in's code: its file(s), their sha256 and, when they are in a git
    repository, its commit and whether the files differ from it (modified or untracked)."""
    file = _module_file(name)
    if file is None:
        return {"module": name, "file": None, "sha256": None, "git_commit": None, "git_dirty": None}
    files = _source_files(file)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(file.parent).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    commit = git_output(file.parent, "rev-parse", "HEAD")
    dirty = None
    if commit is not None:
        status = git_output(file.parent, "status", "--porcelain", "--", *(str(p) for p in files))
        dirty = bool(status) if status is not None else None
    return {"module": name, "file": str(file), "files": len(files), "sha256": digest.hexdigest(),
            "git_commit": commit, "git_dirty": dirty}
