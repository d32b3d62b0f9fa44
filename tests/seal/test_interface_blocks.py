"""No silent no-ops: an environment declares the interface-evolution blocks it honours; a config (or a
``/create``) that turns on another one, or misspells a key inside any block, fails with one line."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from env_service.client import EnvClient, EnvServiceError
from env_service.registry import Environment, get_environment, register_environment, unregister_environment
from seal.config import ConfigError, compose_config
from seal.config_check import check_interface
from seal_shared.interface.blocks import INTERFACE_BLOCKS, block_keys

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins"
CONF = str(PLUGIN_DIR / "home.yaml")


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``home_env`` (honours no block) and ``bare``, the same environment without a ``check_params``."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    sys.modules.pop("home_env", None)
    module = importlib.import_module("home_env")
    env = module.ENVIRONMENT
    register_environment(Environment(name="bare", host_factory=env.host_factory, task_store=env.task_store,
                                     load_split=env.load_split, interface_blocks=["observation_lite"]))
    try:
        yield module
    finally:
        unregister_environment("home")
        unregister_environment("bare")
        sys.modules.pop("home_env", None)


def _one_line(overrides: list[str], *, check: bool = True) -> str:
    with pytest.raises(ConfigError) as err:
        compose_config(CONF, overrides, check=check)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_the_shipped_environments_honour_every_block() -> None:
    for name in ("bfcl", "notes"):
        assert get_environment(name).interface_blocks == INTERFACE_BLOCKS


def test_turning_on_a_block_the_environment_does_not_honour_fails(home: ModuleType) -> None:
    message = _one_line(["+env_service.home.tool_feedback_evolution.enable=true"])
    assert message.startswith("env_service.home.tool_feedback_evolution.enable=true: the 'home' environment "
                              "does not honour tool_feedback_evolution (it honours no interface block)"), message
    assert "fix: drop the block or set enable: false" in message
    # The same before seal eval --conf starts (it skips the full check).
    assert "does not honour" in _one_line(["+env_service.home.observation_lite.enable=true"], check=False)
    bare = ["env_service.env=bare"]
    assert "does not honour diagnostic_evolution (it honours observation_lite)" in _one_line(
        [*bare, "+env_service.bare.diagnostic_evolution.enable=true"])
    compose_config(CONF, [*bare, "+env_service.bare.observation_lite.enable=true"])  # honoured
    compose_config(CONF, [*bare, "+env_service.bare.diagnostic_evolution.enable=false"])  # off: nothing to honour


def test_a_misspelt_key_inside_a_block_fails_without_check_params(home: ModuleType) -> None:
    assert get_environment("bare").check_params is None
    bare = ["env_service.env=bare"]
    assert _one_line([*bare, "+env_service.bare.observation_lite.enabel=true"]) == (
        "env_service.bare.observation_lite.enabel: unknown key (did you mean enable?; known: "
        + ", ".join(block_keys("observation_lite")) + ")")
    assert "did you mean max_lines?" in _one_line([*bare, "+env_service.bare.diagnostic_evolution.max_line=2"])
    assert "expected true or false" in _one_line([*bare, "+env_service.bare.observation_lite.enable=maybe"])
    assert "expected a mapping" in _one_line([*bare, "+env_service.bare.observation_lite=on"])


def test_the_service_refuses_a_block_its_environment_does_not_honour(home: ModuleType) -> None:
    with EnvClient.in_process(env="bare") as client:
        with pytest.raises(EnvServiceError) as err:
            client.create("home_0", {"tool_feedback_evolution": {"enable": "true"}})
        assert err.value.status == 400 and "does not honour tool_feedback_evolution" in err.value.message
        with pytest.raises(EnvServiceError) as err:  # honoured: the episode's own params rule answers
            client.create("home_0", {"observation_lite": {"enable": True}})
        assert "does not honour" not in err.value.message


def test_declared_blocks_must_be_interface_blocks(home: ModuleType) -> None:
    env = home.ENVIRONMENT
    with pytest.raises(ValueError, match="'observation' is not an interface block"):
        Environment(name="x", host_factory=env.host_factory, task_store=env.task_store, load_split=env.load_split,
                    interface_blocks=("observation",))


def test_check_interface_passes_what_an_honouring_environment_reads() -> None:
    params = {"observation_lite": {"enable": True, "categories": ["a"]}, "tool_feedback_evolution": None,
              "diagnostic_evolution": {"enable": True, "lines": ["x"], "max_lines": 2, "category_tags": True},
              "rollout_mode": "sample"}
    check_interface(params, SimpleNamespace(name="bfcl", interface_blocks=INTERFACE_BLOCKS))
