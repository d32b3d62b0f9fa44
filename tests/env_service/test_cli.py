"""``python -m env_service`` ends with one line and a non-zero exit when it cannot serve.

Before the socket was bound up front, a taken or invalid port left the process running for ever with
its worker pool (the workers started before uvicorn tried to bind).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import psutil
import pytest

from live_service import ROOT


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "env_service", "--workers", "2", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _assert_one_line_failure(done: subprocess.CompletedProcess, *needles: str) -> None:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("python -m env_service: ") and "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0]


def _env_service_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "env_service" in " ".join(p.cmdline())]


def test_port_out_of_range_exits_with_one_line() -> None:
    done = _run("--port", "99999")
    _assert_one_line_failure(done, "--port 99999", "fix:")
    assert not _env_service_children()


def test_port_in_use_exits_with_one_line_and_starts_no_workers() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run("--host", "127.0.0.1", "--port", str(port))
    _assert_one_line_failure(done, f"127.0.0.1:{port}", "in use", "fix:")
    assert not _env_service_children()


@pytest.mark.parametrize("args,needle", [
    (("--host", "no-such-host.invalid", "--port", "0"), "no-such-host.invalid"),
    (("--max-instances", "0"), "max_instances"),
    (("--ttl", "-1"), "ttl_s"),
])
def test_other_startup_failures_are_one_line(args: tuple[str, ...], needle: str) -> None:
    _assert_one_line_failure(_run(*args), needle)
