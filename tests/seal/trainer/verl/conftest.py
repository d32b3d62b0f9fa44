"""Fixtures of the verl-backend tests: the composed experiment configs."""

from __future__ import annotations

import pytest

from seal.config import compose_config


@pytest.fixture(scope="session")
def seal_cfg():
    return compose_config("exp/SEAL.yaml")


@pytest.fixture(scope="session")
def vanilla_cfg():
    return compose_config("exp/ablations/vanilla_rl.yaml")
