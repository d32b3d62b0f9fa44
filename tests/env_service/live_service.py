"""A real ``python -m env_service`` on a free port, for the tests that need the whole HTTP stack."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from env_service.client import EnvClient

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_service(*args: str, workers: int = 2) -> Iterator[tuple[str, subprocess.Popen]]:
    """``(base URL, process)`` of a service started with ``args``; stopped on exit."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", str(workers), "--log-level", "warning", *args], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    probe = EnvClient(url)
    try:
        deadline = time.monotonic() + 90
        while not probe.healthz():
            assert proc.poll() is None, f"the service exited with code {proc.returncode}"
            assert time.monotonic() < deadline, "the service did not answer /healthz within 90 s"
            time.sleep(0.1)
        yield url, proc
    finally:
        probe.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
