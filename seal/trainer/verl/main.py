"""Run the SEAL recipe on verl: Ray cluster, FSDP actor/ref workers, async vLLM rollout servers.

:func:`run_verl` is what the launcher calls for ``trainer.backend=verl``. It prepares the config
for a Ray cluster (absolute paths, the project on the workers' ``PYTHONPATH``, TransferQueue on)
and hands over to verl's own ``run_ppo``, which starts Ray from ``ray_kwargs.ray_init`` (a local
cluster, or the cluster at ``ray_kwargs.ray_init.address`` — ``auto``, ``ray://head:10001`` — or
the one named by Ray's ``RAY_ADDRESS``) and runs :class:`SealTaskRunner` as a Ray actor.

:class:`SealTaskRunner` does what verl's ``TaskRunnerV1.run`` does (a Ray actor class cannot be
subclassed): TransferQueue up, :class:`~seal.trainer.verl.trainer.SealPPOTrainer` built and
initialised, verl's ``AgentLoopManagerTQ`` created on the trainer's LLM client, ``fit``, and
TransferQueue closed whatever happened.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Any

import ray
from omegaconf import DictConfig, OmegaConf, open_dict

from seal.config_base import REPO_ROOT, ConfigError
from seal.trainer import RunStopped

logger = logging.getLogger(__name__)

# The trainer prints each step's metrics line in a Ray actor, and Ray's log monitor forwards it to
# this console within a fraction of a second; a shutdown right after the run ends drops what is not
# forwarded yet (ray-project/ray#31931), which is the last step's line with the final validation.
RAY_LOG_GRACE_S = 3.0

# Config keys holding filesystem paths that Ray workers resolve against their own working
# directory; they are made absolute on the driver (relative to where the run was started).
PATH_KEYS = (
    "trainer.default_local_dir",
    "trainer.validation_data_dir",
    "trainer.rollout_data_dir",
    "trainer.resume_from_path",
    "seal.diagnosis.state_dir",
    "seal.diagnosis.stats_dir",
)
FILE_LIST_KEYS = ("data.train_files", "data.val_files")
# Either a local folder or a hub id (``Qwen/Qwen2.5-7B-Instruct``): made absolute only if it exists.
MODEL_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path")
AGENT_LOOPS_YAML = Path(__file__).with_name("agent_loops.yaml")
# The model sections whose attention the FSDP workers set up: the actor and reference policy share
# ``actor_rollout_ref.model``; the actor's own use_remove_padding was resolved from it; the critic
# (unused by GRPO) has its own model section.
ATTENTION_SECTIONS = (("actor_rollout_ref.model", ("actor_rollout_ref.model", "actor_rollout_ref.actor")),
                      ("critic.model", ("critic.model",)))


def _absolute(value: str, base: Path, *, only_existing: bool = False) -> str:
    p = Path(os.path.expanduser(value))
    if p.is_absolute():
        return str(p)
    # Project files (data/, models/) are found relative to the repository when not present here.
    for root in (base, REPO_ROOT):
        if (root / p).exists():
            return str((root / p).resolve())
    return value if only_existing else str((base / p).resolve())


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def apply_attention_fallback(cfg: DictConfig, *, flash_attn: bool) -> bool:
    """Without flash-attn, run the FSDP models on PyTorch's sdpa attention (in place).

    verl loads the actor, reference and critic models with ``flash_attention_2`` unless
    ``<model>.override_config.attn_implementation`` says otherwise, and its ``use_remove_padding``
    path needs flash-attn's varlen kernels. flash-attn is optional (``install.sh --gpu
    --flash-attn`` compiles it), so a machine without it gets ``attn_implementation=sdpa`` and
    ``use_remove_padding=false``. A model section whose ``attn_implementation`` the user set is
    left exactly as configured. Returns whether anything changed.
    """
    if flash_attn:
        return False
    changed = False
    with open_dict(cfg):
        for model_key, padding_keys in ATTENTION_SECTIONS:
            if OmegaConf.select(cfg, model_key) is None or \
                    OmegaConf.select(cfg, f"{model_key}.override_config.attn_implementation") is not None:
                continue
            OmegaConf.update(cfg, f"{model_key}.override_config.attn_implementation", "sdpa", merge=True)
            for key in padding_keys:
                if OmegaConf.select(cfg, f"{key}.use_remove_padding") is not None:
                    OmegaConf.update(cfg, f"{key}.use_remove_padding", False, merge=False)
            changed = True
    return changed


def prepare_config(cfg: DictConfig, *, exp_dir: Path, base: Path | None = None,
                   flash_attn: bool | None = None) -> DictConfig:
    """A resolved copy of ``cfg`` ready for Ray workers on any node of a cluster.

    * ``trainer.validation_data_dir`` defaults to ``<exp_dir>/validation_log`` (the format: :mod:`seal.eval.logs`).
    * Paths (data files, checkpoint and log folders, the agent-loop registry, a local model
      folder) become absolute, relative to ``base`` (default: the current directory) or, for
      files that exist only there, the repository. A hub model id is left as it is.
    * ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` points at this package's
      ``agent_loops.yaml`` unless set: verl's agent-loop workers read it and import the
      ``seal`` agent loop class in their own process.
    * The repository is prepended to the workers' ``PYTHONPATH`` (Ray's runtime env), so the
      ``seal`` and ``env_service`` packages import on every node that has the project at the
      same path; verl's TensorBoard logger writes to ``<exp_dir>/tensorboard``.
    * Without flash-attn (``flash_attn``: None = look for the package), the models use sdpa
      attention and no padding removal (:func:`apply_attention_fallback`), logged once.
    """
    base = Path(base or Path.cwd()).resolve()
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    with open_dict(out):
        for key in PATH_KEYS:
            value = OmegaConf.select(out, key)
            if isinstance(value, str) and value:
                OmegaConf.update(out, key, _absolute(value, base), merge=False)
        for key in MODEL_KEYS:
            value = OmegaConf.select(out, key)
            if isinstance(value, str) and value:
                OmegaConf.update(out, key, _absolute(value, base, only_existing=True), merge=False)
        for key in FILE_LIST_KEYS:
            value = OmegaConf.select(out, key)
            if isinstance(value, str):
                OmegaConf.update(out, key, _absolute(value, base), merge=False)
            elif value is not None:
                OmegaConf.update(out, key, [_absolute(str(v), base) for v in value], merge=False)
        # V1 keeps every batch in TransferQueue; verl's run_ppo passes the switch to Ray's workers.
        out.transfer_queue.enable = True
        if not out.trainer.get("validation_data_dir"):
            out.trainer.validation_data_dir = str(Path(exp_dir).resolve() / "validation_log")
        agent = out.actor_rollout_ref.rollout.agent
        agent.agent_loop_config_path = _absolute(str(agent.agent_loop_config_path or AGENT_LOOPS_YAML), base)
        env_vars = OmegaConf.select(out, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
        paths = [str(REPO_ROOT), env_vars.get("PYTHONPATH") or os.environ.get("PYTHONPATH", "")]
        env_vars = {**env_vars, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
                    "TENSORBOARD_DIR": env_vars.get("TENSORBOARD_DIR") or str(Path(exp_dir).resolve() / "tensorboard")}
        OmegaConf.update(out, "ray_kwargs.ray_init.runtime_env.env_vars", env_vars, merge=False)
    if apply_attention_fallback(out, flash_attn=flash_attn_installed() if flash_attn is None else flash_attn):
        logger.info("flash-attn is not installed: FSDP models use attn_implementation=sdpa and "
                    "use_remove_padding=false (install.sh --gpu --flash-attn compiles it; setting "
                    "actor_rollout_ref.model.override_config.attn_implementation yourself keeps your settings)")
    return out


def run_verl(cfg: DictConfig, *, exp_dir: Path) -> None:
    """Train ``cfg`` with verl on a Ray cluster; SEAL's outputs go to ``exp_dir``.

    Args:
        cfg: the composed, validated experiment config (``trainer.backend=verl``).
        exp_dir: ``experiments/<trainer.experiment_name>``; the launcher has already recorded
            the resolved config, overrides and commit there.
    """
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    from seal.trainer.verl.trainer import check_verl_config

    if cfg.trainer.backend != "verl":
        raise ConfigError(f"trainer.backend={cfg.trainer.backend!r}: run_verl needs trainer.backend=verl")
    check_verl_config(cfg)  # fail on the driver, before Ray and the GPU workers start
    on_cpu = runs_on_cpu(cfg)
    _check_hub_models(cfg)
    exp_dir = Path(exp_dir).resolve()
    prepared = prepare_config(cfg, exp_dir=exp_dir)
    if on_cpu:
        from seal.trainer.verl.cpu import adapt_to_cpu, use_cpu_platform_here

        adapt_to_cpu(prepared)
        use_cpu_platform_here()
    auto_set_device(prepared)
    exp_dir.mkdir(parents=True, exist_ok=True)
    logger.info("verl backend: %d node(s) x %d GPU(s), experiment folder %s", prepared.trainer.nnodes,
                prepared.trainer.n_gpus_per_node, exp_dir)
    try:
        run_ppo(prepared, task_runner_class=_RunnerFactory(str(exp_dir)))
    except ray.exceptions.RayError as exc:
        raise RunStopped(stopped_line(exc, prepared)) from exc
    finally:
        if ray.is_initialized():
            time.sleep(RAY_LOG_GRACE_S)
            ray.shutdown()


def stopped_line(exc: BaseException, cfg: DictConfig) -> str:
    """One line for a run that a Ray failure stopped (a worker killed or out of memory, an actor
    that raised): the root cause's first line and where a resume continues from."""
    cause: BaseException = exc
    while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
        cause = cause.cause
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    # A RayTaskError's text opens with the failing actor's call; the error follows it.
    first = next((line for line in lines if not line.startswith(("ray::", "\x1b"))), lines[0] if lines else "")
    tracker = Path(str(cfg.trainer.default_local_dir)) / "latest_checkpointed_iteration.txt"
    resume = (f"continue from checkpoint step {tracker.read_text().strip()} with trainer.resume_mode=auto"
              if tracker.is_file() else "no checkpoint was written yet")
    return f"the verl run stopped: {type(cause).__name__}: {first[:300]} ({resume})"


def runs_on_cpu(cfg: DictConfig) -> bool:
    """Whether verl runs on this machine's CPU (:mod:`seal.trainer.verl.cpu`): ``trainer.device=cpu``,
    or a local Ray cluster (no ``ray_kwargs.ray_init.address``, no ``RAY_ADDRESS``) on a machine
    without an accelerator. Joining a cluster keeps verl's own device choice."""
    import torch

    if str(cfg.trainer.get("device") or "").lower() == "cpu":
        return True
    joins_cluster = OmegaConf.select(cfg, "ray_kwargs.ray_init.address") or os.environ.get("RAY_ADDRESS")
    return not joins_cluster and not torch.cuda.is_available()


def _check_hub_models(cfg: DictConfig) -> None:
    """On a local Ray cluster the driver shares the workers' hub cache and network: a hub id they
    could not load fails here in one line, not after Ray's start-up and a minute of retries."""
    from seal.config_base import check_hub_model, looks_local

    if OmegaConf.select(cfg, "ray_kwargs.ray_init.address") or os.environ.get("RAY_ADDRESS"):
        return
    for key in ("path", "tokenizer_path"):
        value = OmegaConf.select(cfg, f"actor_rollout_ref.model.{key}")
        if isinstance(value, str) and value and not looks_local(value):
            check_hub_model(f"actor_rollout_ref.model.{key}", value)


class _RunnerFactory:
    """What verl's ``run_ppo`` expects of its ``task_runner_class`` (``.remote()`` and
    ``.options(...).remote()``), creating :class:`SealTaskRunner` actors bound to ``exp_dir``."""

    def __init__(self, exp_dir: str, options: dict | None = None) -> None:
        self.exp_dir = exp_dir
        self._options = dict(options or {})

    def options(self, **kwargs: object) -> _RunnerFactory:
        return _RunnerFactory(self.exp_dir, {**self._options, **kwargs})

    def actor_options(self) -> dict:
        """The runner's Ray options: pinned to the launching node (when Ray runs there), so the
        experiment folder, TensorBoard logs and the diagnosis state land on its disk."""
        options = dict(self._options)
        if "scheduling_strategy" not in options and not ray.util.client.ray.is_connected():
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                node_id=ray.get_runtime_context().get_node_id(), soft=False)
        return options

    def remote(self) -> ray.actor.ActorHandle:
        return SealTaskRunner.options(**self.actor_options()).remote(self.exp_dir)


def build_trainer(config: DictConfig, exp_dir: Path) -> Any:
    """The SEAL trainer on ``config`` (resolved in place), not yet initialised."""
    from seal.trainer.verl.trainer import SealPPOTrainer

    OmegaConf.resolve(config)
    return SealPPOTrainer(config, exp_dir=exp_dir)


@ray.remote
class SealTaskRunner:
    """verl's V1 task runner, building :class:`~seal.trainer.verl.trainer.SealPPOTrainer`."""

    def __init__(self, exp_dir: str) -> None:
        self.exp_dir = Path(exp_dir)

    def run(self, config: DictConfig) -> None:
        import transfer_queue as tq
        from verl.trainer.ppo.v1 import AgentLoopManagerTQ
        from verl.utils.logging_utils import configure_verl_logging

        configure_verl_logging()
        with open_dict(config):
            config.transfer_queue.enable = True
        tq.init(config.transfer_queue)
        trainer = None
        succeeded = False
        try:
            trainer = build_trainer(config, self.exp_dir)
            trainer.init()
            manager_cls = AgentLoopManagerTQ
            fqn = OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class")
            if fqn:  # as verl's runner: a user's manager, which puts its outputs into TransferQueue
                from verl.utils.import_utils import load_class_from_fqn

                manager_cls = load_class_from_fqn(fqn, "AgentLoopManager")
            manager = manager_cls.create(config=config, llm_client=trainer.get_llm_client(),
                                         teacher_client=trainer.get_teacher_client(),
                                         reward_loop_worker_handles=trainer.get_reward_handles())
            trainer.fit(manager)
            succeeded = True
        finally:
            try:
                tracking = getattr(trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()
