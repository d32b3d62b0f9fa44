"""The validation pass on a composed config: one line per bad key, value, task id, file or model."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from seal.config import ConfigError, compose_config

QUICK = "exp/quickstart_bfcl.yaml"


def _error(overrides: list[str], conf: str | Path = QUICK) -> str:
    with pytest.raises(ConfigError) as info:
        compose_config(conf, overrides)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_unknown_key_names_the_nearest_existing_key():
    message = _error(["trainer.total_trainin_steps=1"])
    assert message.startswith("trainer.total_trainin_steps: no such config key")
    assert "did you mean trainer.total_training_steps?" in message
    assert "did you mean seal.local.device?" in _error(["seal.local.devise=cpu"])


def test_wrong_type_under_verls_tree_names_key_value_and_fix():
    message = _error(["data.train_batch_size=abc"])
    assert message.startswith("data.train_batch_size=abc: expected int (fix: ")
    assert _error(["actor_rollout_ref.actor.optim.lr=fast"]).startswith(
        "actor_rollout_ref.actor.optim.lr=fast: expected a number")
    assert _error(["trainer.val_before_train=sometimes"]).startswith(
        "trainer.val_before_train=sometimes: expected true or false")


def test_value_read_through_an_interpolation_is_blamed_on_the_key_the_user_set():
    # verl's actor.rollout_n is ${actor_rollout_ref.rollout.n}: the message names rollout.n.
    assert _error(["actor_rollout_ref.rollout.n=2.5"]).startswith("actor_rollout_ref.rollout.n=2.5: expected int")


def test_typo_in_a_yaml_file_under_verls_tree(tmp_path: Path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("defaults:\n  - /quickstart_bfcl\n  - _self_\ndata:\n  train_bach_size: 4\n")
    assert "data.train_bach_size: no such config key (did you mean data.train_batch_size?" in _error([], bad)


def test_new_keys_added_on_purpose_and_numbers_as_names_are_accepted():
    cfg = compose_config(QUICK, ["+actor_rollout_ref.model.extra_flag=1", "trainer.experiment_name=2024"])
    assert cfg.actor_rollout_ref.model.extra_flag == 1


def test_unparsable_override_is_named():
    message = _error(["data.seed=1", "data.train_batch_size=[1"])
    assert message.startswith("data.train_batch_size=[1: not a valid key=value override")


def test_unknown_task_id_names_the_nearest_real_one():
    message = _error(["seal.tasks.train_ids=[multi_turn_base_99999]"])
    assert "seal.tasks.train_ids: task id 'multi_turn_base_99999' does not exist" in message
    assert "nearest is multi_turn_base_" in message


def test_missing_data_file_is_named_even_when_ids_win():
    message = _error(["data.train_files=data/nope.parquet"])
    assert message.startswith("data.train_files=data/nope.parquet: file not found")
    assert "seal.tasks.train_ids is set" in message


def test_ids_next_to_a_data_file_warn_which_one_wins(caplog):
    with caplog.at_level(logging.WARNING, logger="seal.config_check"):
        compose_config(QUICK)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("seal.tasks.train_ids (2 tasks) wins over data.train_files=") for line in lines)


def test_missing_local_model_folder_fails_at_once():
    t0 = time.monotonic()
    message = _error(["actor_rollout_ref.model.path=models/does-not-exist"])
    assert message.startswith("actor_rollout_ref.model.path=models/does-not-exist: no such model folder")
    assert time.monotonic() - t0 < 10  # no hub look-ups
    # A hub id (org/name) is not a local path and is left to the loader.
    compose_config("exp/SEAL.yaml", ["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"])


class _Hub:
    """``HfApi.model_info`` replaced: the hub's answer without the network."""

    def __init__(self, error: Exception | None) -> None:
        self.error, self.calls = error, []

    def model_info(self, repo_id, *, timeout=None, **kwargs):
        self.calls.append((repo_id, timeout))
        if self.error is not None:
            raise self.error
        return object()

    def patch(self, monkeypatch) -> None:
        import huggingface_hub

        monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                            lambda api, repo_id, **kwargs: self.model_info(repo_id, **kwargs))


def _hub_error(monkeypatch, error: Exception | None, *, offline: bool = False) -> tuple[str | None, _Hub]:
    import huggingface_hub

    from seal.config_base import check_hub_model

    hub = _Hub(error)
    hub.patch(monkeypatch)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    try:
        check_hub_model("actor_rollout_ref.model.path", "nobody/no-such-model")
    except ConfigError as err:
        assert "\n" not in str(err)
        return str(err), hub
    return None, hub


def test_an_unreachable_hub_fails_in_one_line_with_one_short_request(monkeypatch):
    import httpx

    message, hub = _hub_error(monkeypatch, httpx.ConnectError("Name or service not known"))
    assert message.startswith("actor_rollout_ref.model.path=nobody/no-such-model: not in the local hub cache "
                              "and the hub is unreachable (ConnectError")
    assert hub.calls == [("nobody/no-such-model", 10.0)]


def test_an_unknown_hub_id_and_offline_mode_are_one_line_each(monkeypatch):
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError

    url = "https://huggingface.co/api/models/nobody/no-such-model"
    not_found = RepositoryNotFoundError("404", response=httpx.Response(404, request=httpx.Request("GET", url)))
    message, _ = _hub_error(monkeypatch, not_found)
    assert "no such model on the hub" in message
    message, hub = _hub_error(monkeypatch, None, offline=True)
    assert "HF_HUB_OFFLINE is set" in message and hub.calls == []
    assert _hub_error(monkeypatch, None)[0] is None  # reachable and known: left to from_pretrained


def test_a_cached_hub_model_needs_no_request(monkeypatch, tmp_path):
    import huggingface_hub

    from seal.config_base import check_hub_model

    config = tmp_path / "config.json"
    config.write_text("{}")
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: str(config))
    hub = _Hub(AssertionError("no request for a cached model"))
    hub.patch(monkeypatch)
    check_hub_model("actor_rollout_ref.model.path", "Qwen/Qwen2.5-7B-Instruct")
    assert hub.calls == []

