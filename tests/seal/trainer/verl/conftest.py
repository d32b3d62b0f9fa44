"""Fixtures of the verl-backend tests: the composed experiment configs, verl on the CPU platform,
and the TransferQueue that verl's V1 trainer keeps each step's batch in."""

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


@pytest.fixture(scope="module")
def transfer_queue() -> Iterator[None]:
    """A small local Ray and TransferQueue with one storage unit, for one test module
    (:func:`verl_testkit.transfer_queue_running`: one Ray at a time across pytest-xdist workers).
    Per module, not per session: no Ray of these tests outlives the module that needs it, so a
    later module's code that starts or stops Ray itself (``run_verl`` does both) meets none."""
    from verl_testkit import transfer_queue_running

    with transfer_queue_running():
        yield
