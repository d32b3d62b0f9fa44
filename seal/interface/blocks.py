"""The config's check of an environment's interface-evolution blocks (``env_service.<env>`` in the config).

Turning on a block the environment does not honour, or misspelling a key inside any block, fails with one
line naming the key (the blocks and their keys: :mod:`seal_shared.interface.blocks`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from seal_shared.interface.blocks import INTERFACE_BLOCKS, block_keys, unhonoured_message


def check_interface_blocks(params: Mapping[str, Any], honoured: Iterable[str], *, env: str, where: str) -> None:
    """Every interface block of ``params`` is a mapping of known keys with a true/false ``enable``, and
    a block turned on is one ``env`` honours; raises ``ValueError`` with one line naming the key.

    ``where`` is the params' location for the message (``env_service.home`` in a config).
    """
    honoured = tuple(honoured)
    for name in INTERFACE_BLOCKS:
        block = params.get(name)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise ValueError(f"{where}.{name}: expected a mapping of the block's keys (or null), "
                             f"got {type(block).__name__}")
        known = block_keys(name)
        for key in block:
            if key not in known:
                near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                hint = f"did you mean {near[0]}?; " if near else ""
                raise ValueError(f"{where}.{name}.{key}: unknown key ({hint}known: {', '.join(known)})")
        enable = block.get("enable", False)
        if not isinstance(enable, bool):
            raise ValueError(f"{where}.{name}.enable={enable!r}: expected true or false")
        if enable and name not in honoured:
            raise ValueError(unhonoured_message(name, env, honoured, where))
