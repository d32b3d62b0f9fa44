"""Interface evolution, the trainer's half: choosing the guideline lines from the capability state
(:func:`select_guidelines`) and checking a config's interface blocks (:func:`check_interface_blocks`).

The episode's half, which the environment applies (hints, feedback, guideline rendering), is
:mod:`seal_shared.interface`.
"""

from seal.interface.blocks import check_interface_blocks
from seal.interface.guidelines import select_guidelines

__all__ = ["check_interface_blocks", "select_guidelines"]
