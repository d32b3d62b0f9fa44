"""The GPU requirement set (requirements-gpu.txt) installs together: resolved with uv for the GPU
machines' platform, no GPU needed. Plus the rule that keeps it in step with requirements.txt."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_REQS = ROOT / "requirements-gpu.txt"
CPU_REQS = ROOT / "requirements.txt"

# Where the GPU set differs from the CPU pins on purpose (requirements-gpu.txt's header says why).
GPU_VERSIONS = {"torch", "transformers", "fastapi"}
GPU_ONLY = {"verl[vllm]", "vllm", "torchvision", "torchaudio"}
# Tools of the CPU development/CI environment that a GPU machine does not need.
CPU_ONLY = {"uv", "verl"}
# torch 2.11.0 pins an exact nvidia-nccl-cu13 that the package index CI reaches does not carry;
# a release it has stands in, for resolving only: a CUDA machine's install takes torch's own pin,
# and the NCCL wheel requires nothing itself, so the stand-in leaves the rest of the set unchanged.
RESOLVE_OVERRIDES = "nvidia-nccl-cu13==2.27.7\n"


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        assert m, f"{path.name}: '{line}' is not an exact pin (name==version)"
        pins[m.group(1).lower()] = m.group(2)
    return pins


def test_gpu_set_keeps_the_cpu_pins_except_the_gpu_stacks_own():
    cpu, gpu = read_pins(CPU_REQS), read_pins(GPU_REQS)
    assert set(gpu) - set(cpu) == GPU_ONLY
    assert set(cpu) - set(gpu) == CPU_ONLY
    differing = {name for name in cpu.keys() & gpu.keys() if cpu[name] != gpu[name]}
    assert differing == GPU_VERSIONS, "a pin changed in one file only: change both, or list why here"


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert found, "uv not found: it is pinned in requirements.txt (run bash install.sh)"
    return found


# uv's messages when the index cannot be reached at all (no network, DNS failure, proxy down).
_OFFLINE = ("error sending request", "dns error", "failed to connect", "network is unreachable")


def compile_gpu_set(requirements: Path, tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    overrides = tmp_path / "overrides.txt"
    overrides.write_text(RESOLVE_OVERRIDES)
    cmd = [_uv(), "pip", "compile", "--quiet", str(requirements),
           "--python-version", python, "--python-platform", "x86_64-manylinux_2_28",
           "--override", str(overrides), "-o", str(tmp_path / "resolved.txt")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and any(m in done.stderr.lower() for m in _OFFLINE):
        pytest.skip(f"the package registry is unreachable, the GPU set cannot be resolved: {done.stderr[-300:]}")
    return done


@pytest.mark.parametrize("python", ["3.12", "3.11"])
def test_gpu_set_resolves_for_a_cuda_machine(tmp_path, python):
    done = compile_gpu_set(GPU_REQS, tmp_path, python)
    assert done.returncode == 0, f"requirements-gpu.txt does not resolve:\n{done.stderr[-3000:]}"
    resolved = read_pins_loose(tmp_path / "resolved.txt")
    # The resolution keeps the pins as written: the CUDA torch, vLLM, verl and vLLM's fastapi.
    assert resolved["torch"] == "2.11.0" and resolved["vllm"] == "0.24.0"
    assert resolved["verl"] == "0.9.1" and resolved["fastapi"] == "0.136.3"
    assert "ray" in resolved and "flash-attn" not in resolved


def test_resolver_check_rejects_a_cpu_pin_that_conflicts_with_vllm(tmp_path):
    # The set as it was before requirements-gpu.txt was made complete: the CPU path's fastapi pin.
    text = GPU_REQS.read_text().replace("fastapi==0.136.3", "fastapi==0.165.0")
    broken = tmp_path / "broken.txt"
    broken.write_text(text)
    done = compile_gpu_set(broken, tmp_path, "3.12")
    assert done.returncode != 0
    assert "fastapi" in done.stderr and "vllm" in done.stderr


def read_pins_loose(path: Path) -> dict[str, str]:
    """name -> version of a `uv pip compile` output (extras dropped, names normalised)."""
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", line)
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1).lower())] = m.group(2)
    return pins
