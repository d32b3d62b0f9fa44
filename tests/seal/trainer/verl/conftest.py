"""Fixtures of the verl-backend tests: the composed experiment configs, verl on the CPU platform."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from seal.config import compose_config


@pytest.fixture(scope="session")
def seal_cfg():
    return compose_config("exp/SEAL.yaml")


@pytest.fixture(scope="session")
def vanilla_cfg():
    return compose_config("exp/ablations/vanilla_rl.yaml")


@pytest.fixture(scope="module")
def cpu_verl() -> Iterator[None]:
    """verl's workers in this process on the CPU platform the project ships (undone afterwards)."""
    from seal.trainer.verl.cpu import in_process

    with in_process():
        yield
