"""``python -m seal.warm_start --conf exp/X.yaml [-- key=value ...]``: run (or find) the config's
supervised warm start and print the checkpoint's folder. ``install.sh`` runs it for the CPU
quickstart, with ``--fill-validation-cache``, so that the quickstart's minutes are spent on RL."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="python -m seal.warm_start", description=__doc__.split("\n\n")[0])
    ap.add_argument("--conf", required=True, help="experiment config, e.g. exp/quickstart.yaml")
    ap.add_argument("--fill-validation-cache", action="store_true",
                    help="also run the warm-started policy's greedy validation once and keep it in the "
                         "validation cache (seal.local.validation_cache), where a run of this config reads it")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from seal.config import ConfigError, compose_config
    from seal.warm_start import WarmStartSettings, prepare

    try:
        cfg = compose_config(args.conf, overrides)
        if not WarmStartSettings.from_config(cfg).enable:
            print(f"error: {args.conf}: seal.warm_start.enable is false; nothing to do", file=sys.stderr)
            return 2
        cfg = prepare(cfg)
        if args.fill_validation_cache:
            fill_validation_cache(cfg)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(cfg.actor_rollout_ref.model.path)
    return 0


def fill_validation_cache(cfg: object) -> None:
    """The config's step-0 greedy validation, computed (or found) in the validation cache; the
    run's other outputs go to a folder that is deleted after."""
    import tempfile
    from pathlib import Path

    from seal.environment import use_in_process_service
    from seal.trainer.local.loop import LocalTrainer

    # Where the service runs decides nothing of the validation (env_service.url is not in the key).
    use_in_process_service(cfg)
    with tempfile.TemporaryDirectory(prefix="seal-fill-validation-") as tmp:
        trainer = LocalTrainer(cfg, Path(tmp))
        try:
            metrics = trainer.validate(0)
        finally:
            trainer.close()
    logging.getLogger(__name__).info("validation cache: pass rate %.3f (%s)", metrics["val/pass_rate"],
                                     "found" if metrics["val/from_cache"] else "computed and stored")


if __name__ == "__main__":
    sys.exit(main())
