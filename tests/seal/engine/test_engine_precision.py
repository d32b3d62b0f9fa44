"""seal.local.autocast: `auto` picks bf16 only on a device with native bf16; explicit settings win."""

from __future__ import annotations

import logging

import pytest
import torch

from seal.config import ConfigError
from seal.engine import precision
from seal.engine.hf_server import HFServerManager

from tiny_lm import _Tok, tiny_model

# /proc/cpuinfo excerpts: an AMD EPYC Zen 4 (AVX-512 with bf16) and a Zen 3 (AVX2 only).
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu vme sse sse2 avx fma avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 vaes
"""
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7R13
flags\t\t: fpu vme sse sse2 avx fma avx2 vaes vpclmulqdq
"""
SAPPHIRE_RAPIDS_AMX = "flags\t: avx2 avx512f avx512bw amx_tile amx_bf16 amx_int8\n"
SKYLAKE_AVX512 = "flags\t: avx2 avx512f avx512bw avx512vl\n"


def test_cpu_flags_parse_the_flags_line() -> None:
    flags = precision.cpu_flags(ZEN4)
    assert {"avx2", "avx512f", "avx512_bf16"} <= flags and "vendor_id" not in flags
    assert precision.cpu_flags("processor : 0\n") is None


@pytest.mark.parametrize("text", [ZEN4, SAPPHIRE_RAPIDS_AMX])
def test_auto_is_bf16_on_a_cpu_with_bf16_instructions(text: str) -> None:
    choice = precision.resolve_autocast("auto", "cpu", cpuinfo_text=text, capability="AVX512", onednn_bf16=True)
    assert choice.setting == "bf16" and choice.dtype is torch.bfloat16
    assert "bf16" in choice.reason


@pytest.mark.parametrize("text", [ZEN3, SKYLAKE_AVX512])
def test_auto_is_fp32_on_a_cpu_without_bf16_instructions(text: str) -> None:
    # oneDNN says yes on AVX-512 without avx512_bf16 (it emulates bf16): the flags decide.
    choice = precision.resolve_autocast("auto", "cpu", cpuinfo_text=text, capability="AVX512", onednn_bf16=True)
    assert choice.setting == "none" and choice.dtype is None
    assert "avx512_bf16" in choice.reason


@pytest.mark.parametrize(("capability", "onednn", "why"), [("AVX2", True, "ATEN_CPU_CAPABILITY"),
                                                         ("AVX512", False, "ONEDNN_MAX_CPU_ISA")])
def test_auto_is_fp32_when_torch_is_capped_below_bf16(capability: str, onednn: bool, why: str) -> None:
    """A CPU with the flags whose torch kernels or oneDNN are capped (how docs/benchmarks.md
    emulates an AVX2-only CPU) also gets fp32."""
    choice = precision.resolve_autocast("auto", "cpu", cpuinfo_text=ZEN4, capability=capability, onednn_bf16=onednn)
    assert choice.setting == "none" and why in choice.reason


def test_auto_is_fp32_when_the_flags_cannot_be_read() -> None:
    choice = precision.resolve_autocast("auto", "cpu", cpuinfo_text="", capability="AVX512", onednn_bf16=True)
    assert choice.setting == "none" and "unknown" in choice.reason


@pytest.mark.parametrize("text", [ZEN4, ZEN3])
def test_explicit_settings_win(text: str) -> None:
    for setting, dtype in [("bf16", torch.bfloat16), ("fp16", torch.float16), ("none", None)]:
        choice = precision.resolve_autocast(setting, "cpu", cpuinfo_text=text, capability="AVX2", onednn_bf16=False)
        assert choice.setting == setting and choice.dtype is dtype and choice.reason == "set explicitly"


def test_unknown_setting_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"seal\.local\.autocast=fp8: expected one of auto, bf16, fp16, none"):
        precision.resolve_autocast("fp8", "cpu")


def test_generation_server_resolves_auto_from_the_cpu_flags(tmp_path, monkeypatch, caplog) -> None:
    """The server's default (``"auto"``) reads the real flags file: none without bf16 instructions."""
    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo)
    cpuinfo.write_text(ZEN3)
    with caplog.at_level(logging.INFO, logger="seal.engine.precision"):
        server = HFServerManager(tiny_model(), _Tok())
    server.close()
    assert server.autocast_dtype is None
    assert any("generation server precision: fp32" in r.getMessage() for r in caplog.records)
    cpuinfo.write_text(ZEN4)
    monkeypatch.setattr(precision, "cpu_bf16_native", lambda flags, **kw: (True, "native"))
    server = HFServerManager(tiny_model(), _Tok())
    server.close()
    assert server.autocast_dtype is torch.bfloat16
    explicit = HFServerManager(tiny_model(), _Tok(), autocast_dtype="none")
    explicit.close()
    assert explicit.autocast_dtype is None
