"""Interface evolution, the trainer's half: choosing the guideline lines from the capability state
(:func:`select_guidelines`). The config's check of the interface blocks is
:func:`seal.config_check.check_interface`.

The episode's half, which the environment applies (hints, feedback, guideline rendering), is
:mod:`seal_shared.interface`.
"""

from seal.interface.guidelines import select_guidelines

__all__ = ["select_guidelines"]
