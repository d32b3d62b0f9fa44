"""How many tasks' ground truth fits an experiment's episode budget.

Replays each task's ground truth (the oracle's assistant messages, ``BfclEpisode.oracle``) through
the trainers' episode runner (``SealAgentLoop``, the one training and validation use) against the
in-process environment, under the experiment config's budget (``seal.rollout.episode_budget``,
``max_model_len``, ``response_length``, ``max_llm_calls``), with the policy's tokenizer. A task
*fits* when the replayed episode passes BFCL's checker: nothing cut it short.

    python scripts/budget_replay.py --conf exp/SEAL.yaml --category multi_turn_long_context \\
        --tokenizer models/SmolLM2-135M-Instruct [--mode validate|sample] [-- key=value ...]

Prints the fitting count under the config's budget and, for comparison, under the other budget
mode, then through ``seal eval`` (``seal.eval.evaluate.evaluate_episode``) under the config's
budget (both play the one episode loop, :mod:`seal.rollout.episode_loop`), plus the count of tasks whose whole replay (no budget, observations not clipped) stays
within ``max_model_len - response_length`` tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tqdm import tqdm  # noqa: E402

from seal.rollout.oracle_server import OracleServer, play_oracle  # noqa: E402,F401

logger = logging.getLogger("budget_replay")


def replay(cfg: Any, tokenizer: Any, client: Any, task_ids: list[str], mode: str, *, progress: bool) -> dict[str, Any]:
    """Play each task's oracle; returns ``{task_id: (passed, terminated_reason, whole_context_tokens)}``."""
    out = {}
    for task_id in tqdm(task_ids, desc=f"replay ({mode})", disable=not progress):
        _, messages = client.oracle(task_id, tool_call_parser(cfg, mode))
        res, _ = asyncio.run(play_oracle(cfg, tokenizer, client, task_id, messages, rollout_mode=mode))
        e = res.extra_fields
        response = len(res.response_ids) + int(e.get("truncated_response_tokens") or 0)
        whole = int(e.get("num_prompt_tokens") or 0) + response
        out[task_id] = (bool((e.get("check") or {}).get("valid")), e.get("terminated_reason"), whole)
    return out


def tool_call_parser(cfg: Any, mode: str) -> str:
    """The ``tool_call_parser`` a BFCL episode of ``cfg`` in rollout ``mode`` parses calls with
    (an explicit key, else the one its ``tool_prompt_mode`` pairs with)."""
    from env_service.bfcl.episode import BfclParams
    from seal.environment import episode_params

    return str(BfclParams.model_validate(episode_params(cfg, mode, None)).tool_call_parser)


class OracleChatPolicy:
    """A message-level policy for ``seal eval`` that answers with the task's oracle messages
    and counts tokens with the tokenizer's chat template, as a local checkpoint's policy does."""

    def __init__(self, tokenizer: Any, messages: list[str]) -> None:
        self.tokenizer, self.messages, self.calls = tokenizer, list(messages), 0

    def count_tokens(self, messages: list[dict]) -> int:
        from seal.eval.policies import chat_prompt_ids

        return len(chat_prompt_ids(self.tokenizer, messages))

    def complete_with_usage(self, messages: list[dict], sampling: Any) -> Any:
        from seal.eval.policies import Completion

        text = self.messages[self.calls] if self.calls < len(self.messages) else "Done."
        self.calls += 1
        return Completion(text, self.count_tokens(messages), len(self.tokenizer.encode(text)), "stop")

    def complete(self, messages: list[dict], sampling: Any) -> str:
        return self.complete_with_usage(messages, sampling).text


def replay_eval(cfg: Any, tokenizer: Any, client: Any, task_ids: list[str], *, progress: bool) -> dict[str, Any]:
    """The same replay through ``seal eval`` under the config's budget:
    ``{task_id: (passed, terminated_reason, final_context_tokens)}``."""
    from env_service.bfcl.episode import BfclEpisode
    from env_service.bfcl.tasks import default_store
    from seal.eval.policies import SamplingSettings
    from seal.eval.evaluate import VALIDATE_PARAMS, evaluate_episode
    from seal.rollout.settings import RolloutSettings

    store, budget, out = default_store(), RolloutSettings.from_config(cfg), {}
    sampling = SamplingSettings(max_tokens=budget.per_call_tokens)
    for task_id in tqdm(task_ids, desc="replay (seal eval)", disable=not progress):
        policy = OracleChatPolicy(tokenizer, BfclEpisode.oracle(store.get(task_id)))
        rec = evaluate_episode(client, policy, task_id, params=dict(VALIDATE_PARAMS), sampling=sampling, budget=budget)
        out[task_id] = (bool(rec.valid), rec.terminated_reason, policy.count_tokens(rec.messages))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conf", default="exp/SEAL.yaml", help="experiment config (default: exp/SEAL.yaml)")
    p.add_argument("--category", default="multi_turn_long_context", help="task category to replay")
    p.add_argument("--tokenizer", default="models/SmolLM2-135M-Instruct", help="local tokenizer/checkpoint folder")
    p.add_argument("--mode", choices=["validate", "sample"], default="validate",
                   help="rollout mode: validate (evaluation interface) or sample (training interface)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N tasks")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not (Path(args.tokenizer) / "tokenizer.json").is_file():
        print(f"budget_replay: no tokenizer in {args.tokenizer} (run install.sh, or pass --tokenizer DIR)",
              file=sys.stderr)
        return 2

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from env_service.bfcl.tasks import default_store
    from env_service.client import EnvClient
    from seal.config import ConfigError, compose_config
    from seal.rollout.settings import RolloutSettings

    try:
        cfg = compose_config(args.conf, ["env_service.url=null", *overrides])
    except ConfigError as err:
        print(f"budget_replay: {err}", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    ids = default_store().ids(category=args.category)[: args.limit]
    if not ids:
        print(f"budget_replay: no task in category {args.category!r}", file=sys.stderr)
        return 2
    settings = RolloutSettings.from_config(cfg)
    other = "response" if settings.episode_budget == "context" else "context"
    client = EnvClient.in_process()
    try:
        results = {}
        for budget in (settings.episode_budget, other):
            run_cfg = OmegaConf.merge(cfg, {"seal": {"rollout": {"episode_budget": budget}}})
            results[budget] = replay(run_cfg, tokenizer, client, ids, args.mode, progress=True)
        # No budget at all and unclipped observations: each task's whole replayed context.
        unbounded = OmegaConf.merge(cfg, {"seal": {"rollout": {"episode_budget": "context", "max_env_tokens": 10**7}},
                                          "actor_rollout_ref": {"rollout": {"max_model_len": 10**7}}})
        whole = replay(unbounded, tokenizer, client, ids, args.mode, progress=True)
        evaluated = replay_eval(cfg, tokenizer, client, ids, progress=True)
    finally:
        client.close()
    n = len(ids)
    fit = {b: sum(ok for ok, _, _ in r.values()) for b, r in results.items()}
    release = sum(ok and length <= settings.context_cap for ok, _, length in whole.values())
    print(f"{args.category}: {n} tasks, mode {args.mode}, {args.conf} (max_model_len {settings.max_model_len}, "
          f"response_length {settings.response_length}, max_llm_calls {settings.max_llm_calls})")
    print(f"  episode_budget={settings.episode_budget} (this config): {fit[settings.episode_budget]}/{n} fit")
    print(f"  episode_budget={other}: {fit[other]}/{n} fit")
    print(f"  seal eval (its runner, this config's budget): {sum(ok for ok, _, _ in evaluated.values())}/{n} fit")
    print(f"  whole unclipped replay within {settings.context_cap} tokens (prompt + every turn, observations "
          f"not clipped): {release}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
