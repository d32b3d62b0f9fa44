"""The local trainer backend: one process, CPU or one GPU (``trainer.backend: local``)."""

from seal.trainer.local.loop import LocalTrainer, run_local

__all__ = ["LocalTrainer", "run_local"]
