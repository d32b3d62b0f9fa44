"""The SEAL config schema: every SEAL key of an experiment config, with its one default and its doc.

Each block is a dataclass; a field's ``doc`` (field metadata) says what it does and its ``rule``
(:class:`~seal.config_base.Rule`) which values it allows beyond its type, the one statement that
both the config pass and the settings classes check. Blocks whose settings class predates the
schema are that class (``RewardConfig``, ``APatchConfig``: their rules sit beside their fields),
documented in :data:`DOCS`. :func:`register` stores the defaults in Hydra's ConfigStore as
``seal_schema``, which ``exp/seal_base.yaml`` names first in its defaults list. An environment's params block
(``env_service.<env>``) is the environment's own pydantic model (``Environment.check_params``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from seal.advantage.weights import APatchConfig
from seal.config_base import BASE_YAML, FieldSpec, Rule, field_specs, select
from seal.diagnosis.stats import DiagnosisConfig
from seal.rewards import RewardConfig
from seal_shared import DEFAULT_ENVIRONMENT, DEFAULT_TIMEOUT_S
from seal_shared.types import FailureTag

SCHEMA_NAME = "seal_schema"
_Block = TypeVar("_Block")


# The choices of seal.rollout.episode_budget and seal.local.autocast (the engine reads the latter).
EPISODE_BUDGETS = ("context", "response")
AUTOCAST_SETTINGS = ("auto", "bf16", "fp16", "none")


def knob(default: Any, doc: str, rule: Rule | None = None, **allowed: Any) -> Any:
    """A schema field: its one default, its one doc and the values it allows (``rule``, or the
    rule's own keywords: ``knob(20, "...", ge=1)``)."""
    metadata = {"doc": doc}
    if rule or allowed:
        metadata["rule"] = rule or Rule(**allowed)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _reweighters() -> list[str]:
    """Read when checked: plug-ins register reweighters after this module is imported."""
    from seal.advantage import known_reweighters

    return known_reweighters()


@dataclass
class TrainerKeys:
    """SEAL's keys under verl's ``trainer`` block."""

    backend: str = knob("verl", "Which trainer runs the recipe: verl (Ray + FSDP + vLLM, GPUs) or local "
                        "(one process, CPU or one GPU); both read the same verl keys.",
                        choices=("verl", "local"))
    save_best_checkpoint: bool = knob(False, "After every validation pass, checkpoint a step strictly better "
                                      "than every earlier one (global_step_<k>, named in best_checkpoint.json "
                                      "and the `best` link).")
    keep_only_best_checkpoint: bool = knob(True, "Delete every other global_step_* folder except the latest "
                                           "(the resume point).")
    best_checkpoint_metric: str | None = knob(None, "The compared score; null = the alphabetically first "
                                              "per-category pass rate (the release's choice).")
    best_checkpoint_mode: str = knob("max", "max | min.", choices=("max", "min"))
    save_best_checkpoint_in_val_only: bool = knob(False, "A validation-only run saves a best checkpoint only "
                                                  "with this on.")


@dataclass
class EnvServiceKeys:
    """``env_service``: which environment, and where its service listens."""

    env: str = knob(DEFAULT_ENVIRONMENT, "The environment, by its registered name (bfcl, notes, or a plug-in's); its "
                    "per-episode params are the block env_service.<env>.")
    url: str | None = knob("http://127.0.0.1:8082", "Where the environment service listens; local backend: "
                           "null (with urls empty) runs it in-process.", pattern=r"https?://\S+",
                           means="an http:// or https:// URL")
    urls: list = knob([], "Several service replicas (each episode sticks to one); overrides url when non-empty.")
    timeout_s: float = knob(DEFAULT_TIMEOUT_S, "Per-request timeout of the environment client (seconds).", gt=0)


@dataclass
class DiagnosisKeys:
    """``seal.diagnosis``: where the capability state and the epoch stats are saved."""

    state_dir: str | None = knob(None, "Capability-state folder; null = experiments/<name>/diagnostic_state.")
    stats_dir: str | None = knob(None, "Epoch-stats folder; null = experiments/<name>/diagnostic_stats.")
    save_every_n_steps: int = knob(0, "Save the state every N steps as well as at each epoch end and with "
                                   "every checkpoint (0 = no).",
                                   rule=field_specs(DiagnosisConfig)["save_every_n_steps"].rule)


@dataclass
class AdvantageKeys:
    """``seal.advantage``: the reweighter applied to the GRPO advantages."""

    reweighter: str = knob("apatch", "apatch, identity, or one a plug-in registers; each reads its own block "
                           "seal.advantage.<name>.", choices=_reweighters)
    apatch: APatchConfig = field(default_factory=APatchConfig, metadata={"doc": "A-Patch's settings."})
    turn_credit: bool = knob(False, "Per-turn credit from the diagnosis: a turn tagged right never gets a negative "
                             "advantage, a failed turn never a positive one (off in SEAL; docs/paper_map.md).")


@dataclass(frozen=True)
class RolloutKeys:
    """``seal.rollout``: the episode budget and options (read by :class:`seal.rollout.settings.RolloutSettings`)."""

    max_llm_calls: int = knob(20, "LLM calls per episode (the release counts the whole episode, not one turn).",
                              ge=1)
    max_llm_calls_per_turn: int | None = knob(None, "Optional per-turn cap on LLM calls (null = none).", ge=1)
    max_env_tokens: int = knob(4096, "Observations are clipped to this many tokens.", ge=1)
    few_shot: bool = knob(False, "Prepend a short tool-use example conversation to every prompt (off in the "
                          "paper's recipe).")
    env_retries: int = knob(1, "An episode whose environment fails is retried this many times, then counted as "
                            "an environment fault (never trained on).", ge=0)
    max_tokens_per_call: int | None = knob(None, "New tokens per LLM call (null = actor_rollout_ref.rollout."
                                           "response_length, as the release).", ge=1)
    episode_budget: str = knob("context", "What ends an episode besides max_llm_calls. context (the release's): "
                               "no LLM call once the raw context reaches max_model_len - response_length; the "
                               "episode is scored whole and only its training tensors are cut. response: the "
                               "continuation after the prompt stops at max_response_length.",
                               choices=EPISODE_BUDGETS)


@dataclass(frozen=True)
class WarmStartKeys:
    """``seal.warm_start``: supervised warm start on oracle episodes before RL (:mod:`seal.warm_start`;
    off in the paper's recipe). Local backend: on seal.local.device; verl backend: verl's SFT trainer."""

    enable: bool = knob(False, "Run the warm start before RL.")
    task_ids: tuple[str, ...] | None = knob(None, "Its tasks (training tasks only); null = the environment's "
                                            "train split.")
    max_tasks: int | None = knob(None, "The first N of those tasks (null = all).", ge=1)
    exclude_from_rl: bool = knob(True, "Leave the warm start's tasks out of RL training, so the RL curve is "
                                 "measured on tasks the warm start never imitated.")
    epochs: int = knob(2, "Passes over the transcripts.", ge=1)
    lr: float = knob(5.0e-5, "Learning rate.", gt=0)
    batch_size: int = knob(1, "Transcripts per optimizer step (token-mean loss over them).", ge=1)
    grad_clip: float = knob(1.0, "Gradient-norm clip.", gt=0)
    closing_weight: float = knob(1.0, "Loss weight of the model-written messages that close a turn without a "
                                 "call (the oracle's closing line); 1 = as every other token. Lower, the "
                                 "policy learns the calls more than the line that ends a turn. Local "
                                 "fine-tune only.", ge=0, le=1)
    seed: int = knob(0, "Seed of the fine-tune.")
    output: str | None = knob(None, "The checkpoint folder; null = models/warm_start/<model>-<env>-<fingerprint>.")


@dataclass
class SpeculativeKeys:
    """``seal.local.speculative``: prompt-lookup speculative decoding in the local generation engine
    (:mod:`seal.engine.speculative`; rollout, validation and ``seal eval``). Exact: greedy answers are
    the same tokens, sampled ones the same distribution (and the same tokens for a seed)."""

    enable: bool = knob(True, "Draft each row's next tokens from the last earlier occurrence of its last "
                        "few tokens in its own context and verify them in one forward (false = one token per "
                        "forward).")
    max_draft: int = knob(6, "Most tokens drafted per row and decode step.", ge=1)
    ngram: int = knob(3, "Longest n-gram looked up (then shorter ones, down to 2). Also orders every sampled "
                      "draw, so a seeded answer depends on it (not on enable or max_draft).", ge=2)


@dataclass
class LocalKeys:
    """``seal.local``: the local trainer (``trainer.backend: local``); the verl backend ignores it."""

    device: str = knob("auto", "cpu | cuda | cuda:<i> | auto (cuda when available).",
                       pattern=r"cpu|cuda|cuda:\d+|auto", means="cpu, cuda, cuda:<i> or auto")
    autocast: str = knob("auto", "Autocast dtype (auto | bf16 | fp16 | none). auto: bf16 where the device runs "
                         "it natively, fp32 otherwise; the weights stay fp32.", choices=AUTOCAST_SETTINGS)
    generation_batch_size: int = knob(16, "Most requests batched into one HF generate call.", ge=1)
    shared_prefix_min_tokens: int = knob(128, "Rows of a generation batch sharing at least this many leading "
                                         "tokens read them once per forward (0 = off).", ge=0)
    speculative: SpeculativeKeys = field(default_factory=SpeculativeKeys, metadata={"doc": ""})
    shared_prefix_training: bool = knob(True, "Update and log-prob passes compute the prompt a GRPO group's "
                                        "episodes share once and run each episode's continuation on it, with "
                                        "LM-head logits only where a log-prob is read; the same losses, "
                                        "gradients and log-probs as one sequence per episode, to fp32 rounding "
                                        "(false = one full sequence per episode). Not with gradient "
                                        "checkpointing, which drops the cache: then each episode is its own "
                                        "sequence.")
    max_concurrent_episodes: int = knob(16, "Most episodes in flight at once.", ge=1)
    max_fault_fraction: float = knob(0.5, "Stop the run when more than this fraction of a step's episodes "
                                     "fault (after retries); below it they are left out of the update.",
                                     ge=0, le=1)
    sampled_validation_n: int = knob(0, "Beside the greedy validation pass, this many sampled episodes per "
                                     "validation task (0 = none): val_sampled/pass_rate over n x tasks, each "
                                     "task's pass fraction in validation_log_sampled/<step>.jsonl. More held-out "
                                     "episodes for the same tasks, so a change in pass rate is measured finer.",
                                     ge=0)
    sampled_validation_temperature: float = knob(1.0, "Sampling temperature of those episodes (top_p 1).", gt=0)
    validation_cache: bool = knob(True, "Keep a fresh run's greedy validation before its first step, keyed by "
                                  "everything that decides it (weights, tasks and their prompts, the config "
                                  "less names, lengths and update settings, code, CPU arithmetic), in "
                                  "models/validation_cache/; a run with the same key reads it instead of "
                                  "validating again (install.sh fills the quickstart's). false = always "
                                  "validate.")
    tensorboard: bool = knob(True, "Also write scalars to experiments/<name>/tensorboard/.")
    progress_bars: bool = knob(True, "tqdm progress bars for rollouts and validation.")


@dataclass
class TasksKeys:
    """``seal.tasks``: which tasks train and validate (by default those of data.train_files / val_files)."""

    train_ids: list | None = knob(None, "Explicit training task ids; override data.train_files when set.")
    val_ids: list | None = knob(None, "Explicit validation task ids; override data.val_files when set.")
    categories: list | None = knob(None, "Keep only these categories (e.g. [multi_turn_base]); null = all.")
    from_tags: list | None = knob(None, "Train only on the training tasks whose episodes in from_log carry any "
                                  "of these tags (validation tasks are never filtered); null = no filter.")
    from_log: str | None = knob(None, "The validation log (file, or validation_log / seal eval --out folder) "
                                "that from_tags reads.")
    max_prompt_tokens: int | None = knob(None, "Keep only tasks whose real initial prompt has at most this many "
                                         "tokens; null: on verl the training split uses data.max_prompt_length.",
                                         ge=1)
    max_train_tasks: int | None = knob(None, "Keep the first N training tasks after the filters; null = all.",
                                       ge=1)
    match_val_categories: bool = knob(False, "Keep the training tasks in the validation split's category shares "
                                      "(each category's first ones, max_train_tasks of them) instead of the "
                                      "first N as listed; false = as listed.")
    max_val_tasks: int | None = knob(None, "Keep the first N validation tasks after the filters; null = all.",
                                     ge=1)
    validate_on_test: bool = knob(False, "Accept tasks of the environment's held-out test split in explicit ids "
                                  "and data files, with a warning (the paper's BFCL recipe validates on BFCL's "
                                  "val + test, data/bfcl_eval_400.parquet); false = refuse them: only a final "
                                  "evaluation reads the test split.")


@dataclass
class SealKeys:
    """``seal``: diagnosis-driven training."""

    enable: bool = knob(True, "Master switch; false = vanilla GRPO (no capability state, no A-Patch, no "
                        "guideline evolution).")
    plugins: list = knob([], "Modules imported before the run that register failure tags and advantage "
                         "reweighters (docs/extending.md).")
    diagnosis: DiagnosisKeys = field(default_factory=DiagnosisKeys, metadata={"doc": ""})
    advantage: AdvantageKeys = field(default_factory=AdvantageKeys, metadata={"doc": ""})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"doc": ""})
    rollout: RolloutKeys = field(default_factory=RolloutKeys, metadata={"doc": ""})
    warm_start: WarmStartKeys = field(default_factory=WarmStartKeys, metadata={"doc": ""})
    local: LocalKeys = field(default_factory=LocalKeys, metadata={"doc": ""})
    tasks: TasksKeys = field(default_factory=TasksKeys, metadata={"doc": ""})


@dataclass
class Schema:
    """The SEAL keys of a composed experiment config."""

    trainer: TrainerKeys = field(default_factory=TrainerKeys)
    env_service: EnvServiceKeys = field(default_factory=EnvServiceKeys)
    seal: SealKeys = field(default_factory=SealKeys)


# Docs of the fields of the settings classes the schema reuses (their modules own the defaults).
DOCS = {
    "seal.reward.mode": "binary (the paper's recipe) | capped | progress.",
    "seal.reward.partial_credit_cap": "capped: the most a failed episode earns.",
    "seal.reward.partial_credit_weight": "capped: a failed episode earns min(cap, weight x progress).",
    "seal.reward.cap_decay": "capped: decay the cap linearly to min_cap over trainer.total_epochs.",
    "seal.reward.min_cap": "capped with cap_decay: the cap's floor.",
    "seal.reward.irrelevance_weight": "progress: the weight of irrelevance turns in a failed episode's share of passed turns.",
    "seal.reward.scorable_floor": "progress: a failed episode that passed none of its scorable turns earns 0.",
    "seal.advantage.apatch.enable": "A-Patch's own switch (seal.enable=false turns it off too).",
    "seal.advantage.apatch.min_scale": "Smallest advantage scale.",
    "seal.advantage.apatch.max_scale": "Largest advantage scale.",
    "seal.advantage.apatch.apply_to": "Which rows are reweighted: all | positive_advantage | negative_advantage.",
    "seal.advantage.apatch.warmup_steps": "Training steps before A-Patch (and its dynamic update) starts.",
    "seal.advantage.apatch.metric_prefix": "Prefix of A-Patch's logged metrics.",
    "seal.advantage.apatch.tag_weights": "Weight per failure tag; a partial map is merged over the registered "
                                         "tags' defaults.",
    "seal.advantage.apatch.dynamic.enable": "Closed-loop (EMA) update of the tag weights from the capability state.",
    "seal.advantage.apatch.dynamic.ema_beta": "EMA step of the dynamic weights.",
    "seal.advantage.apatch.dynamic.prevalence_alpha": "How strongly a tag's prevalence raises its weight.",
    "seal.advantage.apatch.dynamic.confidence_samples": "Episodes of a tag before its prevalence counts fully.",
    "seal.advantage.apatch.budget.enable": "Squeeze the scales toward 1 and renormalise their mean (off in SEAL).",
    "seal.advantage.apatch.budget.min_scale": "Smallest scale after the squeeze.",
    "seal.advantage.apatch.budget.max_scale": "Largest scale after the squeeze.",
    "seal.advantage.apatch.budget.strength": "How far the scales move toward 1.",
    "seal.advantage.apatch.budget.normalize_mean": "Renormalise the scales' mean to target_mean.",
    "seal.advantage.apatch.budget.target_mean": "The mean scale normalize_mean aims at.",
}


def _plain_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return {str(k): _plain_value(v) for k, v in value.items()}
    return value


def default_tree() -> dict[str, Any]:
    """The schema's defaults as a plain nested dict (``{"trainer": ..., "env_service": ..., "seal": ...}``).

    ``seal.advantage.apatch.tag_weights`` lists the release's tags only: a plug-in's tag registered
    earlier in the process must not change the tree (its weight is added with ``+key=...``).
    """
    tree = _plain_value(Schema())
    weights = tree["seal"]["advantage"]["apatch"]["tag_weights"]
    release = {str(t) for t in FailureTag}
    tree["seal"]["advantage"]["apatch"]["tag_weights"] = {t: w for t, w in weights.items() if t in release}
    return tree


def default_config() -> DictConfig:
    """The schema's defaults plus exp/seal_base.yaml's recipe values, without verl's keys."""
    base = OmegaConf.load(BASE_YAML)
    base.pop("defaults", None)
    return OmegaConf.merge(default_tree(), base)


def register() -> None:
    """Store the defaults in Hydra's ConfigStore as ``seal_schema`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=default_tree())


def entries(node: Any = None, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """``(dotted key, default, doc)`` of every leaf key of the schema."""
    node = Schema() if node is None else node
    for f in dataclasses.fields(node):
        key = f"{prefix}{f.name}"
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from entries(value, key + ".")
        else:
            yield key, _plain_value(value), f.metadata.get("doc") or DOCS.get(key, "")


@functools.cache
def leaf_specs(cls: type = Schema, prefix: str = "") -> dict[str, FieldSpec]:
    """``dotted key -> FieldSpec`` (type, whether null is allowed, rule) of every leaf key of the schema."""
    out: dict[str, FieldSpec] = {}
    for name, spec in field_specs(cls).items():
        if dataclasses.is_dataclass(spec.kind):
            out.update(leaf_specs(spec.kind, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = spec
    return out


@functools.lru_cache(maxsize=1)
def _cached_tree() -> dict[str, Any]:
    return default_tree()


def schema_default(key: str) -> Any:
    """The schema's default of the dotted ``key`` (KeyError when the schema has no such key)."""
    node: Any = _cached_tree()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"{key}: not a key of the SEAL config schema (seal/schema.py)")
        node = node[part]
    return copy.deepcopy(node)


def setting(cfg: Any, key: str) -> Any:
    """``cfg``'s value at the schema key ``key``; the schema's default where ``cfg`` lacks the key
    or holds null (a bare verl config, a plain dict in a test)."""
    return select(cfg, key, schema_default(key))


def block(cls: type[_Block], cfg: Any, key: str) -> _Block:
    """The schema block ``cls`` at ``key`` of ``cfg``, typed (a missing key takes its default)."""
    return cls(**(select(cfg, key) or {}))
