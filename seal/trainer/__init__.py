"""Trainer backends and the co-evolution step (:mod:`seal.trainer.coevolution`) they share.

``seal.trainer.coevolution.CoEvolution`` is the backend-agnostic SEAL side of a step;
``seal.trainer.local.run_local`` and ``seal.trainer.verl.run_verl`` are the two backends.
Submodules are imported on use: the co-evolution step needs no model code, the backends need torch/verl.
"""


class RunStopped(RuntimeError):
    """A run stopped on purpose with a message for the user (e.g. too many environment faults)."""
