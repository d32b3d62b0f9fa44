"""Which autocast dtype a device should run: ``seal.local.autocast`` (``auto | bf16 | fp16 | none``).

The weights stay fp32 either way (master weights); autocast only changes the dtype of the matmuls.
bf16 pays off only where the hardware runs it natively. On a CPU without bf16 instructions
(AVX2-only, or AVX-512 without ``avx512_bf16``) every bf16 matmul is emulated through conversions
and runs several times slower than fp32, so ``auto`` picks bf16 only when

* CPU: ``/proc/cpuinfo`` lists ``avx512_bf16`` or ``amx_bf16``, torch's kernels run at the AVX-512
  level (``torch.backends.cpu.get_cpu_capability()``; ``ATEN_CPU_CAPABILITY`` can cap it) and
  oneDNN reports bf16 support (``ONEDNN_MAX_CPU_ISA`` can cap it). oneDNN's own check alone is not
  enough: it also says yes on AVX-512 CPUs that only emulate bf16. A CPU whose flags cannot be
  read (no ``/proc/cpuinfo``) gets fp32.
* CUDA: ``torch.cuda.is_bf16_supported(including_emulation=False)`` (Ampere and newer).

Anything else gets full precision. An explicit ``bf16`` / ``fp16`` / ``none`` is used as given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from seal.config_base import ConfigError
from seal.schema import AUTOCAST_SETTINGS

logger = logging.getLogger(__name__)

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}
# x86 feature flags (as /proc/cpuinfo spells them) of native bf16 arithmetic.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class AutocastChoice:
    """A resolved setting: ``setting`` is ``bf16``, ``fp16`` or ``none``; ``reason`` is for the log."""

    setting: str
    reason: str

    @property
    def dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES[self.setting]


def cpu_flags(cpuinfo_text: str | None = None) -> set[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` text (read from the system when ``None``);
    ``None`` when there is no such file or no ``flags`` line."""
    if cpuinfo_text is None:
        try:
            cpuinfo_text = CPUINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return None


def cpu_bf16_native(flags: set[str] | None, *, capability: str | None = None,
                    onednn_bf16: bool | None = None) -> tuple[bool, str]:
    """Whether this CPU runs bf16 natively, and why (see the module docstring).

    ``capability`` / ``onednn_bf16`` default to torch's own answers (tests pass them in)."""
    if flags is None:
        return False, "CPU flags unknown (no /proc/cpuinfo flags line)"
    have = sorted(f for f in BF16_CPU_FLAGS if f in flags)
    if not have:
        isa = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "no avx2"
        return False, f"CPU has no {'/'.join(BF16_CPU_FLAGS)} ({isa}): bf16 would be emulated"
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    if not capability.upper().startswith("AVX512"):
        return False, f"CPU has {','.join(have)} but torch's kernels run at {capability} (ATEN_CPU_CAPABILITY)"
    onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) if onednn_bf16 is None else onednn_bf16
    if not onednn_bf16:
        return False, f"CPU has {','.join(have)} but oneDNN has bf16 disabled (ONEDNN_MAX_CPU_ISA)"
    return True, f"CPU has {','.join(have)}, torch kernels {capability}"


def resolve_autocast(setting: str, device: torch.device | str, *, cpuinfo_text: str | None = None,
                     capability: str | None = None, onednn_bf16: bool | None = None) -> AutocastChoice:
    """``seal.local.autocast`` resolved for ``device``; ``auto`` follows the module docstring."""
    if setting not in AUTOCAST_SETTINGS:
        raise ConfigError(f"seal.local.autocast={setting}: expected one of {', '.join(AUTOCAST_SETTINGS)}")
    if setting != "auto":
        return AutocastChoice(setting, "set explicitly")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return AutocastChoice("bf16", f"{torch.cuda.get_device_name(device)} runs bf16 natively")
        return AutocastChoice("none", f"{torch.cuda.get_device_name(device)} has no native bf16")
    if device.type != "cpu":
        return AutocastChoice("none", f"device {device.type}: autocast auto enables bf16 on CPU and CUDA only")
    native, why = cpu_bf16_native(cpu_flags(cpuinfo_text), capability=capability, onednn_bf16=onednn_bf16)
    return AutocastChoice("bf16" if native else "none", why)


def log_choice(setting: str, choice: AutocastChoice, where: str) -> None:
    """The one start-up line naming the precision and why."""
    precision = "fp32 (no autocast)" if choice.setting == "none" else f"{choice.setting} autocast over fp32 weights"
    logger.info("%s precision: %s [seal.local.autocast=%s: %s]", where, precision, setting, choice.reason)
