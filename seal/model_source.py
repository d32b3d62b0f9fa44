"""Where a model comes from: a folder on this machine or a hub id, and whether a hub id can be
loaded here. Kept apart from the config pass so that the trainers, which load models, need
nothing of the pass."""

from __future__ import annotations

import os
from pathlib import Path

from seal.config_base import REPO_ROOT, ConfigError


def looks_local(path: str) -> bool:
    """Whether a model path names a folder on this machine rather than a hub id (``org/name``)."""
    p = Path(os.path.expanduser(path))
    if p.is_absolute() or path.startswith((".", "~")) or len(p.parts) > 2:
        return True
    # `models/X`: the first part is a folder here (or in the project), so this is not `org/name`.
    return len(p.parts) == 2 and any((root / p.parts[0]).is_dir() for root in (Path.cwd(), REPO_ROOT))


def check_hub_model(key: str, repo_id: str, *, timeout_s: float = 10.0) -> None:
    """A hub id that is neither in the local hub cache nor reachable fails in one line at once.

    ``from_pretrained`` retries an unreachable hub for about a minute before it gives up; one
    metadata request with a short timeout answers the same question. Called where a model is
    about to be loaded (never in the config check: composing a config needs no network).
    """
    import httpx
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return
    fix = "fix: download it once with network access, or point the key at a local model folder"
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"{key}={repo_id}: not in the local hub cache and HF_HUB_OFFLINE is set ({fix})")
    try:
        HfApi().model_info(repo_id, timeout=timeout_s)
    except RepositoryNotFoundError:
        raise ConfigError(f"{key}={repo_id}: no such model on the hub, or a private/gated one this machine is not "
                     "logged in for (fix: check the id, or run `hf auth login`)") from None
    except (httpx.HTTPError, OSError) as exc:
        raise ConfigError(f"{key}={repo_id}: not in the local hub cache and the hub is unreachable "
                     f"({type(exc).__name__}: {exc}; {fix})") from None
