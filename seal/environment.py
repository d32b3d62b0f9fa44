"""The trainer's view of the configured environment: its name, its params, its catalogue, its client.

``env_service.env`` names the environment (one the service can serve); its per-episode parameters
are the block ``env_service.<env>`` (``env_service.bfcl`` for BFCL), sent with every ``/create``
(:func:`episode_params`). Splits and task categories come from the environment's catalogue
(``/v1/catalogue``), never from the spelling of an id. The trainer reaches the environment only
through :mod:`env_service.client`: an in-process service answers what is needed before the
service runs (the config check, the catalogue).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from env_service.client import EnvCatalogue, EnvClient, registry_changes
from seal.config_base import select, to_plain
from seal.schema import setting

log = logging.getLogger(__name__)


def environment_name(cfg: Any) -> str:
    """``env_service.env`` (the schema's default when the config has no such key)."""
    return str(setting(cfg, "env_service.env"))


def config_plugins(cfg: Any) -> tuple[str, ...]:
    """``seal.plugins``: the modules a service of this config imports (one may register the environment)."""
    return tuple(str(m) for m in select(cfg, "seal.plugins") or ())


def standing_client(env: str, plugins: Iterable[str] = ()) -> EnvClient:
    """A client of an in-process service of ``env`` (no workers, no socket), kept for the process
    (the config check asks it often) and replaced after an environment is registered or removed;
    ``ValueError`` for a name no environment is registered under.

    A service left behind is closed, or its loop thread would idle for the process's life: all of
    them when the registry changes (each may serve a replaced registration), and the least
    recently used one beyond :data:`MAX_STANDING`."""
    key, state = (env, tuple(plugins)), registry_changes()
    if _STANDING_STATE[0] != state:
        while _STANDING:
            _STANDING.popitem()[1].close()
        _STANDING_STATE[0] = state
    client = _STANDING.pop(key, None) or EnvClient.in_process(env=env, plugins=key[1])
    _STANDING[key] = client  # the most recently used last
    while len(_STANDING) > MAX_STANDING:
        _STANDING.pop(next(iter(_STANDING))).close()
    return client


MAX_STANDING = 4
# The standing in-process services by (environment, plug-ins), least recently used first, all built
# under the registry state in _STANDING_STATE.
_STANDING: dict[tuple[str, tuple[str, ...]], EnvClient] = {}
_STANDING_STATE = [-1]


@functools.lru_cache(maxsize=8)
def _catalogue(env: str, plugins: tuple[str, ...], registry_state: int) -> EnvCatalogue:
    del registry_state  # only the cache's key: a registration change asks the catalogue again
    return standing_client(env, plugins).catalogue()


def check_env_params(env: str, block: dict[str, Any], plugins: Iterable[str] = ()) -> str | None:
    """Why environment ``env`` refuses the episode-params block ``block`` (one line), or ``None``."""
    return standing_client(env, plugins).check_params(block)


def catalogue_of(env: str, plugins: Iterable[str] = ()) -> EnvCatalogue:
    """Environment ``env``'s catalogue (asked once per process, again after an environment is
    registered or removed); ``ValueError`` for a name no environment is registered under."""
    return _catalogue(env, tuple(plugins), registry_changes())


def environment(cfg: Any) -> EnvCatalogue:
    """The catalogue of the environment the config names."""
    return catalogue_of(environment_name(cfg), config_plugins(cfg))


def env_params_block(cfg: Any) -> dict[str, Any]:
    """The environment's per-episode params, ``env_service.<env>`` ({} when absent)."""
    name = environment_name(cfg)
    block = select(cfg, f"env_service.{name}")
    if block is None:
        return {}
    if not isinstance(block, Mapping):
        raise ValueError(f"env_service.{name}: expected a mapping of episode params")
    return dict(block)


def task_categories(cfg: Any, task_ids: Iterable[str]) -> dict[str, str]:
    """``task_id -> category`` as the environment's task store records it."""
    env = environment(cfg)
    try:
        return env.categories_of(list(task_ids))
    except KeyError as err:
        raise ValueError(f"env_service.env={env.name}: {err.args[0]}") from None


def held_out_problem(env: EnvCatalogue, ids: Iterable[str], key: str) -> tuple[list[str], str]:
    """The ``ids`` (from ``key``) of tasks ``env`` holds out for a final evaluation, and the one line
    that refuses them (``[]``: none). Held out: a task the environment knows in neither its train nor
    its val split, i.e. of its test split; found without reading the test split (the catalogue
    lists train and val only), so task selection and the config check never read it."""
    chosen = set(env.load_split("train")) | set(env.load_split("val"))
    held = [i for i in ids if i in env and i not in chosen]
    listed = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    return held, (f"{key}: {listed} {'is' if len(held) == 1 else 'are'} in {env.name}'s held-out test split, "
                  "which only a final evaluation reads (fix: name train or val tasks, or set "
                  "seal.tasks.validate_on_test=true to validate on test knowingly, as the paper's BFCL recipe does)")


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in; nested mappings merge key by key, other values replace."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(to_plain(value))
    return out


def episode_params(cfg: Any, rollout_mode: str, env_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``/create`` params: the environment's block (``env_service.<env>``, e.g.
    ``env_service.bfcl``) + ``rollout_mode``, then the row's ``env_params``."""
    base = env_params_block(cfg)
    params = deep_merge(base, {"rollout_mode": rollout_mode})
    if env_params:
        env_params = to_plain(env_params)
        if not isinstance(env_params, Mapping):
            raise ValueError(f"dataset field env_params: expected a mapping, got {type(env_params).__name__}")
        params = deep_merge(params, env_params)
    return params


def use_in_process_service(cfg: Any) -> None:
    """Point ``cfg`` at an in-process environment service (no ``env_service.url`` / ``urls``), as
    the local backend runs without ``--with-env``."""
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.env_service.url = None
        cfg.env_service.urls = []


def make_env_client(cfg: Any, *, retries: int | None = None) -> Any:
    """An :class:`env_service.client.EnvClient` for ``env_service.urls`` / ``env_service.url``,
    or an in-process service of ``env_service.env`` when both are unset (costly per episode:
    inject a shared client). ``retries``: the HTTP client's own retries of idempotent calls
    (default: the client's; the local trainer passes 0, its runner retries whole episodes)."""
    timeout = float(setting(cfg, "env_service.timeout_s"))
    urls = select(cfg, "env_service.urls") or []
    url = select(cfg, "env_service.url")
    if not urls and not url:
        log.info("environment service: in-process")
        # seal.plugins first: one of them may register the environment (a no-op where the config
        # check imported them already, needed where only the plain config travelled).
        return EnvClient.in_process(env=environment_name(cfg), plugins=config_plugins(cfg))
    target = list(urls) if urls else str(url)
    log.info("environment service: %s", target)
    return EnvClient(target, timeout_s=timeout, **({} if retries is None else {"retries": retries}))
