"""``env_service.kit.hosts:<name>``: the host factory of kit environment ``<name>`` (each service process
resolves it as the environment's ``host_factory``). Every attribute but the module's own dunders is
a zero-argument function building that environment's host, so no environment writes one; the module
keeps no other public name, so no environment name can hit one."""

import env_service.kit.environment as _environment


def __getattr__(name: str) -> object:
    """PEP 562: ``hosts.<name>`` is the host factory of environment ``<name>``."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def host() -> object:
        return _environment.episode_host(name)

    host.__qualname__ = host.__name__ = name
    return host
