"""Run an experiment: ``python launcher.py --conf exp/X.yaml [--with-env] [-- key=value ...]``.

* ``--conf`` names an experiment YAML (composed on verl's config and the SEAL schema, ``exp/seal_base.yaml``);
  Hydra overrides follow ``--`` or are given bare (``key=value``).
* ``--with-env`` (alias ``--with-bfcl``) starts the environment service of ``env_service.env``
  (``python -m env_service --env <name>``) over HTTP when nothing answers at ``env_service.url``
  (waits on ``/healthz``; stops it at the end, and it dies with the launcher even on SIGKILL). Without it the local backend embeds the service in-process, unless the
  experiment sets ``env_service.url``/``urls`` itself (on the command line or in its YAML): then
  that service is used and must answer. The verl backend uses the configured URL as is.
* ``.env`` in the current folder is loaded first (``example.env`` lists every variable).
* ``experiments/<trainer.experiment_name>/`` receives the resolved ``config.yaml``,
  ``overrides.txt``, ``git_commit.txt`` and, with ``seal.plugins``, ``plugins.json`` (each plug-in
  module's file hash and its repository's commit), then everything the trainer writes.

A bad config (unknown key, wrong type, unknown task id, missing file or model folder) fails with
one line naming the key, before the model, Ray or the service start; so does any other expected
failure (``--debug`` or ``SEAL_DEBUG=1`` shows the full traceback). Rerunning a complete
experiment prints where its results are and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

REPO_ROOT = Path(__file__).resolve().parent

logger = logging.getLogger("launcher")


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="launcher.py", description=__doc__.splitlines()[0])
    parser.add_argument("--conf", required=True, help="experiment YAML, e.g. exp/quickstart.yaml")
    parser.add_argument("--with-env", "--with-bfcl", dest="with_env", action="store_true",
                        help="start the HTTP environment service of env_service.env (python -m env_service "
                             "--env <name>) if env_service.url does not answer; --with-bfcl is the same flag")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of any error (also SEAL_DEBUG=1)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides key=value (after `--` or bare)")
    args = parser.parse_args(argv)
    overrides = [o for o in args.overrides if o != "--"]
    bad = [o for o in overrides if "=" not in o]
    if bad:
        parser.error(f"override {bad[0]!r} is not key=value")
    return args, overrides


def git_commit() -> str:
    """``<sha>`` (plus `` (dirty)`` with uncommitted changes), or ``unknown`` outside a git checkout."""
    from seal.plugins import git_output

    sha = git_output(REPO_ROOT, "rev-parse", "HEAD")
    dirty = git_output(REPO_ROOT, "status", "--porcelain", "--untracked-files=no")
    if sha is None or dirty is None:
        return "unknown"
    return f"{sha} (dirty)" if dirty else sha


def write_run_files(exp_dir: Path, cfg, overrides: Sequence[str], conf: str) -> None:
    """The resolved config, the command-line overrides and the code version of this run."""
    from omegaconf import OmegaConf

    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True), encoding="utf-8")
    (exp_dir / "overrides.txt").write_text("".join(f"{o}\n" for o in [f"--conf {conf}", *overrides]),
                                           encoding="utf-8")
    (exp_dir / "git_commit.txt").write_text(git_commit() + "\n", encoding="utf-8")
    write_plugin_record(exp_dir, list(cfg.seal.get("plugins") or []))


def write_plugin_record(exp_dir: Path, modules: Sequence[str]) -> None:
    """``plugins.json`` beside ``git_commit.txt``: per ``seal.plugins`` module its file, sha256 and
    the commit of its git repository (:func:`seal.plugins.plugin_record`); none when there are none."""
    import json

    from seal.plugins import plugin_record

    path = exp_dir / "plugins.json"
    if modules:
        path.write_text(json.dumps([plugin_record(str(m)) for m in modules], indent=2) + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)  # a rerun without plug-ins leaves no stale record


def _healthy(url: str) -> bool:
    from env_service.client import EnvClient

    with EnvClient(url, timeout_s=2.0, retries=0) as client:
        return client.healthz()


def _die_with_parent(parent: int) -> None:
    """In the service's process, before exec: Linux sends it SIGTERM when the launcher dies,
    however it dies (SIGKILL included), so no service is left orphaned on its port."""
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


@contextmanager
def env_service(url: str, env: str = "bfcl", *, plugins: Sequence[str] = (),
                wait_s: float = 120.0) -> Iterator[None]:
    """Make sure the HTTP service answers at ``url``: start one serving ``env`` (and stop it after)
    if nothing does; it imports the ``plugins`` modules (``seal.plugins``) as the trainer does."""
    if _healthy(url):
        logger.info("environment service already up at %s", url)
        yield
        return
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.port is None:
        raise SystemExit(f"error: env_service.url={url}: nothing answers there and --with-env starts "
                         "a service only on 127.0.0.1/localhost with an explicit port")
    cmd = [sys.executable, "-m", "env_service", "--env", env, "--host", parsed.hostname, "--port", str(parsed.port)]
    cmd += [arg for module in plugins for arg in ("--plugin", str(module))]
    logger.info("starting the environment service: %s", " ".join(cmd[1:]))
    from seal.plugins import child_environment

    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=child_environment([str(m) for m in plugins]),
                            preexec_fn=partial(_die_with_parent, os.getpid()) if sys.platform == "linux" else None)
    try:
        deadline = time.monotonic() + wait_s
        while not _healthy(url):
            if proc.poll() is not None:
                raise SystemExit(f"error: the environment service exited with code {proc.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"error: the environment service did not answer /healthz at {url} in {wait_s:.0f} s")
            time.sleep(0.5)
        logger.info("environment service up at %s (pid %d)", url, proc.pid)
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def dispatch(cfg, exp_dir: Path) -> None:
    """Hand the run to the configured backend."""
    backend = str(cfg.trainer.backend)
    if backend == "local":
        from seal.trainer.local import run_local

        run_local(cfg, exp_dir=exp_dir)
        return
    try:
        from seal.trainer.verl import run_verl
    except ImportError as exc:
        raise SystemExit(f"error: trainer.backend=verl needs seal.trainer.verl.run_verl, which is not available "
                         f"({exc}); install the GPU extras (install.sh --gpu) or use trainer.backend=local") from exc
    run_verl(cfg, exp_dir=exp_dir)


def explicit_service(cfg, overrides: Sequence[str]) -> bool:
    """Whether the experiment names its environment service itself (command line or YAML) rather
    than leaving the schema's default."""
    from seal.schema import schema_default

    if any(o.lstrip("+").startswith(("env_service.url=", "env_service.urls=")) for o in overrides):
        return True
    return (cfg.env_service.url != schema_default("env_service.url")
            or list(cfg.env_service.urls or []) != list(schema_default("env_service.urls")))


def choose_service(cfg, overrides: Sequence[str], with_env: bool) -> None:
    """The local backend's environment: in-process by default; an explicit URL is used (and must
    answer now, rather than fail on the first episode after the model has loaded)."""
    from seal.config import ConfigError
    from seal.environment import use_in_process_service

    if str(cfg.trainer.backend) != "local" or with_env:
        return
    if not explicit_service(cfg, overrides):
        use_in_process_service(cfg)
        return
    for url in list(cfg.env_service.urls or []) or [cfg.env_service.url]:
        if url is not None and not _healthy(str(url)):
            raise ConfigError(f"env_service.url={url}: nothing answers there (fix: start it with "
                              f"`python -m env_service --env {cfg.env_service.env} --port <port>`, add --with-env "
                              "to start one, or drop the setting to run the environment in-process)")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from seal.config import compose_config, experiment_dir
    from seal import warm_start
    from seal.trainer.finished import finished_message

    cfg = compose_config(args.conf, overrides)
    exp_dir = experiment_dir(cfg)
    done = finished_message(cfg, exp_dir)
    if done:
        print(done, file=sys.stderr)
        return 0
    choose_service(cfg, overrides, args.with_env)
    cfg = warm_start.prepare(cfg)
    write_run_files(exp_dir, cfg, overrides, args.conf)
    logger.info("experiment folder: %s", exp_dir)
    if args.with_env and not cfg.env_service.urls:
        with env_service(str(cfg.env_service.url), str(cfg.env_service.env),
                         plugins=list(cfg.seal.get("plugins") or [])):
            dispatch(cfg, exp_dir)
    else:
        dispatch(cfg, exp_dir)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dotenv import load_dotenv

    load_dotenv(Path.cwd() / ".env", override=False)
    debug = args.debug or os.environ.get("SEAL_DEBUG", "").lower() in ("1", "true", "yes")
    from seal.config import ConfigError
    from seal.trainer import RunStopped

    # SIGTERM unwinds like Ctrl-C, so `finally` blocks stop the service and close files.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run(args, overrides)
    except (OSError, ImportError, RuntimeError, ValueError) as exc:  # ConfigError and RunStopped among them
        if debug:
            raise
        if isinstance(exc, (ConfigError, RunStopped)):  # their message is the one line already
            print(f"error: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ConfigError) else 1
        text = str(exc).strip().splitlines()
        print(f"error: {type(exc).__name__}: {text[0] if text else ''} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
