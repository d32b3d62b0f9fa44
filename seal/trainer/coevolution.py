"""The co-evolution step: SEAL's side of a training step, shared by the local and the verl backends.

Diagnoses of the step's episodes update the capability state, which in turn evolves the agent's
training interface (guidelines) and reweights the learning signal (A-Patch): the paper's co-evolution.

A trainer (either backend) calls, per step:

1. :meth:`CoEvolution.env_params` — the per-episode environment parameters, with the guideline
   lines chosen from the capability state when guideline evolution is on;
2. :meth:`CoEvolution.observe` — the step's *training* episodes feed the capability state;
3. :meth:`CoEvolution.reweight` — the configured reweighter (``seal.advantage.reweighter``) on the
   GRPO advantages, then :meth:`CoEvolution.credit_turns` (``seal.advantage.turn_credit``);
4. :meth:`CoEvolution.after_step`, then :meth:`CoEvolution.step_metrics`.

Checkpoints carry :meth:`state_dict` (or :meth:`save` / :meth:`load` on a folder): the
capability state, the epoch's error counter and the reweighter's own state. A fresh run starts
with an empty state; only an explicit resume loads one, so a state left in the experiment folder
by an unrelated earlier run is never picked up silently.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from seal.advantage import REWEIGHTERS, TAG_WEIGHTS, get_reweighter_spec
from seal.advantage.turn_credit import credit_turns
from seal.config_base import ConfigError, to_plain
from seal.diagnosis.state import CapabilityState
from seal.diagnosis.stats import DiagnosisConfig, DiagnosisStats
from seal.environment import env_params_block, episode_params
from seal.episode import EpisodeResult
from seal.interface.guidelines import select_guidelines
from seal_shared.interface.guidelines import GuidelineConfig
from seal_shared.plugins import load_plugins

logger = logging.getLogger(__name__)

STATE_FILE = "capability_state.json"
HOOKS_FILE = "seal_hooks.json"
HOOKS_VERSION = 2
# One line per resume of the run, in the experiment folder: {"resumed_from": step, "checkpoint": folder}.
RESUMES_FILE = "resumes.jsonl"
ROLLOUT_MODES = {True: "sample", False: "validate"}


class CoEvolution:
    """Capability state, guideline selection, the reweighter and diagnosis stats for one run.

    ``seal.enable=false`` makes every hook a no-op: no state, identity advantages (the
    ``identity`` reweighter), no guidelines (the environment parameters are still returned).
    """

    def __init__(self, cfg: DictConfig, exp_dir: Path) -> None:
        self.cfg = cfg
        self.exp_dir = Path(exp_dir)
        seal = cfg.seal
        self.enabled = bool(seal.enable)
        # The configured environment's params block (env_service.<env_service.env>).
        self.env_block: dict[str, Any] = env_params_block(cfg)
        try:
            load_plugins(to_plain(seal.get("plugins")) or [])
            self.diag_cfg = DiagnosisConfig(save_every_n_steps=int(seal.diagnosis.save_every_n_steps))
            self.guide_cfg = GuidelineConfig.from_diagnostic_evolution(self.env_block.get("diagnostic_evolution"))
            selected = get_reweighter_spec(str(seal.advantage.reweighter))
            # Every reweighter block in the config is checked, not only the selected one's.
            settings = {name: REWEIGHTERS[name].build_config(to_plain(seal.advantage.get(name)))
                        for name in dict.fromkeys([*seal.advantage, selected.name]) if name in REWEIGHTERS}
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"seal: {exc}") from exc
        self.reweighter = selected if self.enabled else get_reweighter_spec("identity")
        self.reweighter_cfg = settings[selected.name] if self.enabled else None
        self.reweighter_state: dict[str, Any] = {}  # what the reweighter's prepare kept last step
        self.turn_credit = self.enabled and bool(seal.advantage.turn_credit)
        self.state_dir = Path(seal.diagnosis.state_dir or self.exp_dir / "diagnostic_state")
        self.stats_dir = Path(seal.diagnosis.stats_dir or self.exp_dir / "diagnostic_stats")
        self.state: CapabilityState | None = CapabilityState() if self.enabled else None
        self.stats = DiagnosisStats(self.state, self.diag_cfg) if self.state is not None else None
        self.error_counter: Counter[str] = Counter()

    def guidelines_enabled(self, *, train: bool) -> bool:
        evo = self.env_block.get("diagnostic_evolution") or {}
        return self.enabled and bool(evo.get("enable")) and (train or bool(evo.get("apply_to_validation")))

    def guideline_lines(self, *, train: bool, category: str | None = None) -> list[str] | None:
        """The guideline lines an episode gets (None when guideline evolution does not apply):
        selected from the capability state, per ``category`` when ``category_tags`` is set."""
        if not (self.guidelines_enabled(train=train) and self.state is not None):
            return None
        cat = category if self.guide_cfg.per_category else None
        return select_guidelines(self.state, category=cat, cfg=self.guide_cfg)

    def env_params(self, *, train: bool, category: str | None = None) -> dict[str, Any]:
        """One episode's ``/create`` params (a fresh dict each call), merged by the one rule,
        :func:`seal.environment.episode_params`: the environment's block, the rollout mode
        (``train``: ``sample``, else ``validate``) and the selected guideline lines, if any."""
        lines = self.guideline_lines(train=train, category=category)
        extra = {} if lines is None else {"diagnostic_evolution": {"lines": lines}}
        return episode_params(self.cfg, ROLLOUT_MODES[bool(train)], extra)

    def observe(self, episodes: Iterable[EpisodeResult], *, epoch: int, step: int) -> dict[str, float]:
        """Feed the step's *training* episodes to the capability state.

        Excluded episodes (faults, prompts that did not fit) are skipped: they were not played to
        the end, so their diagnosis says nothing about the policy.
        """
        observed = skipped = 0
        for ep in episodes:
            if ep.excluded:
                skipped += 1
                continue
            observed += 1
            if self.state is None:
                continue
            self.state.observe(ep.category, ep.task_id, ep.reward, ep.valid, list(ep.tags), epoch, step)
            self.error_counter.update(ep.error_messages)
        n = self.diag_cfg.save_every_n_steps
        if self.state is not None and n and step % n == 0:
            self.save_state()
        return {"seal/observed_episodes": float(observed), "seal/skipped_fault_episodes": float(skipped)}

    def reweight(
        self, advantages: torch.Tensor, tags: list[list[str] | None], *, step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Apply the configured reweighter: its ``prepare`` on the capability state and on the
        state it kept the step before (A-Patch: the dynamic tag-weight update), then its function
        on ``advantages`` ``(B, T)`` with ``tags`` (``B`` per-turn tag lists; ``None`` / empty: no
        diagnosis, scale 1). Returns new ``(B, T)`` advantages and ``seal/...`` metrics."""
        weights, self.reweighter_state = self.reweighter.prepare_step(
            self.reweighter_cfg, step, self.state, self.reweighter_state)
        return self.reweighter.fn(advantages, tags, cfg=self.reweighter_cfg, weights=weights, step=step)

    def credit_turns(self, advantages: torch.Tensor, response_mask: torch.Tensor,
                     call_turns: Sequence[Sequence[int | None] | None],
                     tags: Sequence[Sequence[str] | None]) -> tuple[torch.Tensor, dict[str, float]]:
        """With ``seal.advantage.turn_credit``, each turn's tokens keep the episode's advantage only
        where the turn's diagnosis agrees (:mod:`seal.advantage.turn_credit`); otherwise unchanged."""
        if not self.turn_credit:
            return advantages, {}
        return credit_turns(advantages, response_mask, call_turns, tags)

    def step_metrics(self) -> dict[str, float]:
        """Capability-state scalars for the step (``seal/diagnosis/...``)."""
        if self.stats is None:
            return {}
        out = self.stats.metrics(self.reweighter_state.get(TAG_WEIGHTS))
        if self.guidelines_enabled(train=True):
            out["seal/guidelines/num_lines"] = float(len(self.guideline_lines(train=True) or []))
        return out

    def after_step(self, epoch: int, step: int, *, ends_epoch: bool, last_step: bool) -> None:
        """The step's bookkeeping, the same on both backends: at an epoch's last step,
        :meth:`end_epoch`; at the run's last step in the middle of an epoch, save the state so
        the run's (non-empty) window is kept."""
        if ends_epoch:
            self.end_epoch(epoch, step)
        elif last_step:
            self.save_state()

    def end_epoch(self, epoch: int, step: int) -> None:
        """Dump ``diagnostic_stats/epoch_<e>.json``, save the state, *then* reset the window, so
        the saved window holds the epoch that just ended."""
        if self.state is None or self.stats is None:
            return
        self.stats_dir.mkdir(parents=True, exist_ok=True)
        dump = self.stats.epoch_dump(epoch, step, self.error_counter, self.reweighter_state.get(TAG_WEIGHTS))
        path = self.stats_dir / f"epoch_{int(epoch)}.json"
        path.write_text(json.dumps(dump, indent=2, sort_keys=True), encoding="utf-8")
        self.save_state()
        self.state.reset_window()
        self.error_counter.clear()
        logger.info("epoch %d ended at step %d: stats in %s", epoch, step, path)

    def save_state(self) -> None:
        """Write the live state to ``diagnostic_state/capability_state.json`` (atomic)."""
        if self.state is not None:
            self.state.save(self.state_dir / STATE_FILE)

    def state_dict(self) -> dict[str, Any]:
        return {**self._meta(), "capability_state": self.state.to_dict() if self.state is not None else None}

    def _meta(self) -> dict[str, Any]:
        return {"version": HOOKS_VERSION, "enabled": self.enabled, "error_counter": dict(self.error_counter),
                "reweighter": self.reweighter.name, "reweighter_state": self.reweighter_state}

    def load_state_dict(self, data: Mapping[str, Any]) -> None:
        if data.get("version") != HOOKS_VERSION:
            raise ValueError(f"SEAL hooks state version {data.get('version')!r} is not {HOOKS_VERSION}")
        saved = data.get("capability_state")
        if self.enabled and saved is None:
            raise ValueError("the checkpoint holds no capability state (saved with seal.enable=false); "
                             "resume with seal.enable=false or start a new run")
        self.state = CapabilityState.from_dict(saved) if self.enabled else None
        self.stats = DiagnosisStats(self.state, self.diag_cfg) if self.state is not None else None
        self.error_counter = Counter(data.get("error_counter") or {})
        self.reweighter_state = dict(data["reweighter_state"]) if data["reweighter"] == self.reweighter.name else {}
        if data["reweighter"] != self.reweighter.name and data["reweighter_state"]:
            logger.warning("the checkpoint's reweighter state is %r's; %r starts without one",
                           data["reweighter"], self.reweighter.name)

    def save(self, directory: Path) -> None:
        """Write the state into ``directory`` (a checkpoint folder): the capability state file
        (byte-identical to what :meth:`load` restores) plus ``seal_hooks.json`` (the epoch's error
        counter and the reweighter's state)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.state is not None:
            self.state.save(directory / STATE_FILE)
        (directory / HOOKS_FILE).write_text(json.dumps(self._meta(), sort_keys=True), encoding="utf-8")

    def load(self, directory: Path, *, step: int | None = None) -> None:
        """Restore what :meth:`save` wrote; missing or corrupt files raise (never a silent fresh start).

        ``step``: the training step of the checkpoint a run resumes from; it is appended to the
        experiment's ``resumes.jsonl`` (what scripts/check_run_outputs.py reads as the resume point).
        """
        directory = Path(directory)
        meta = json.loads((directory / HOOKS_FILE).read_text(encoding="utf-8"))
        if meta.get("version") == 1:
            meta = _meta_from_version_1(meta, directory / STATE_FILE)
        state = CapabilityState.load(directory / STATE_FILE).to_dict() if self.enabled else None
        self.load_state_dict({**meta, "capability_state": state})
        if step is not None:
            self.exp_dir.mkdir(parents=True, exist_ok=True)
            with (self.exp_dir / RESUMES_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps({"resumed_from": int(step), "checkpoint": str(directory.parent)}) + "\n")


def _meta_from_version_1(meta: Mapping[str, Any], state_file: Path) -> dict[str, Any]:
    """A version-1 checkpoint kept A-Patch's dynamic tag weights inside the capability state file."""
    state = json.loads(state_file.read_text(encoding="utf-8")) if state_file.is_file() else {}
    return {**meta, "version": HOOKS_VERSION, "reweighter": "apatch",
            "reweighter_state": {TAG_WEIGHTS: state.get("dynamic_tag_weights") or {}}}
