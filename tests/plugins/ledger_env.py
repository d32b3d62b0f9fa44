"""``ledger``: an environment that brings its own executor, plugged in through ``seal.plugins`` only.

Built on the public environment kit (:mod:`env_service.kit`) as ``docs/extending.md`` walks through
for an environment whose tools already run somewhere: a bookkeeping engine with its own command
interface answers each command with a status code and a line of text. The environment supplies that
engine as its world (tool errors declared by the status code, not guessed from the text), a task
subclass with the accounts' starting balances, its own per-turn check (a replay on fresh engines that
reads ``model_turns``) and its own verdict rule (a turn fails on wrong balances only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from env_service.kit import (
    CallParseError, Task, TaskStore, ToolEpisode, ToolResult, TurnCheck, TurnVerdict, parse_call,
    register_tool_environment, turn_failure,
)

RESPONSE_MISMATCH = "multi_turn:execution_response_mismatch"


class Ledger:
    """The existing engine: accounts and three commands, each answering ``(status, text)``; status 0 is
    success, 2 a declined command."""

    COMMANDS = ("balance", "deposit", "transfer")

    def __init__(self, balances: dict[str, int]) -> None:
        self.balances = dict(balances)

    def execute(self, command: str, args: dict[str, Any]) -> tuple[int, str]:
        if command == "balance":
            return 0, f"{args['account']}: {self.balances.get(args['account'], 0)}"
        if command == "deposit":
            self.balances[args["account"]] = self.balances.get(args["account"], 0) + int(args["amount"])
            return 0, f"{args['account']}: {self.balances[args['account']]}"
        source, target, amount = args["source"], args["target"], int(args["amount"])
        if self.balances.get(source, 0) < amount:
            return 2, f"declined: {source} holds {self.balances.get(source, 0)}"
        self.balances[source] -= amount
        self.balances[target] = self.balances.get(target, 0) + amount
        return 0, f"moved {amount} from {source} to {target}"


class LedgerWorld:
    """The world: the engine runs each call string; its status code declares the tool errors."""

    def __init__(self, balances: dict[str, int]) -> None:
        self.ledger = Ledger(balances)

    def run(self, call: str) -> ToolResult:
        try:
            parsed = parse_call(call)
        except CallParseError as err:
            return ToolResult(f"cannot read {call!r}: {err}", error="parse")
        if parsed.name not in Ledger.COMMANDS or parsed.args:
            return ToolResult(f"no command {parsed.name!r} with these arguments", error="unknown")
        try:
            status, text = self.ledger.execute(parsed.name, parsed.kwargs)
        except (KeyError, TypeError, ValueError) as err:
            return ToolResult(f"bad arguments for {parsed.name}: {err!r}", error="arguments")
        return ToolResult(text, tool_error=status != 0)


def _doc(name: str, description: str, **params: str) -> dict[str, Any]:
    properties = {p: {"type": "integer" if p == "amount" else "string", "description": d} for p, d in params.items()}
    return {"name": name, "description": description,
            "parameters": {"type": "dict", "properties": properties, "required": list(params)}}


TOOLS = [_doc("balance", "Read an account's balance.", account="the account's name"),
         _doc("deposit", "Pay money into an account.", account="the account's name", amount="how much"),
         _doc("transfer", "Move money between two accounts.", source="the paying account",
              target="the receiving account", amount="how much")]


@dataclass(frozen=True, kw_only=True)
class LedgerTask(Task):
    """A kit task plus the accounts' starting balances."""

    balances: dict[str, int] = field(default_factory=dict)


TASKS = [
    LedgerTask(id="ledger_0", category="transfer", split="train", balances={"alice": 100, "bob": 20},
               user_turns=["Move 30 from alice to bob.", "What does bob hold now?"],
               gt_turns=[["transfer(source='alice', target='bob', amount=30)"], ["balance(account='bob')"]],
               tools=TOOLS),
    LedgerTask(id="ledger_1", category="deposit", split="val", balances={"bob": 20},
               user_turns=["Pay 5 into bob's account."], gt_turns=[["deposit(account='bob', amount=5)"]], tools=TOOLS),
    LedgerTask(id="ledger_2", category="transfer", split="test", balances={"alice": 100, "bob": 20},
               user_turns=["How much does alice hold?", "Thanks."], gt_turns=[["balance(account='alice')"], []],
               tools=TOOLS),
]


class LedgerEpisode(ToolEpisode):
    """One rollout: the kit's protocol on a fresh engine, with the ledger's own check and verdict."""

    task: LedgerTask

    def start(self) -> LedgerWorld:
        return LedgerWorld(self.task.balances)

    def check_turns(self) -> list[TurnCheck]:
        """Replay the accepted calls (``model_turns``: turn -> step -> call strings) and the ground truth
        on two fresh engines; compare the balances and the ground truth's results."""
        model, truth = self.start(), self.start()
        checks, seen = [], []
        for k, gt_calls in enumerate(self.task.gt_turns):
            calls = [call for step in (self.model_turns[k] if k < len(self.model_turns) else []) for call in step]
            runs = [model.run(call) for call in calls]
            gt_runs = [truth.run(call) for call in gt_calls]
            seen += [r.text for r in runs]
            checks.append(TurnCheck.of(
                gt_calls=gt_calls, model_calls=calls, model_results=[r.text for r in runs],
                state_valid=model.ledger.balances == truth.ledger.balances if runs else None,
                response_valid=all(r.text in seen for r in gt_runs) if gt_calls and runs else None,
                gt_error=any(not r.executed for r in gt_runs), model_executed=any(r.executed for r in runs),
                errors=[r.text for r in runs if r.failed]))
        return checks

    def judge_turn(self, check: TurnCheck, index: int) -> TurnVerdict | None:
        """The ledger judges by the money: a turn whose balances are right passes even when the model
        did not read back what the ground truth read (it is still tagged ``response_mismatch``)."""
        verdict = turn_failure(check.evidence, index)
        return None if verdict is not None and verdict[0] == RESPONSE_MISMATCH else verdict


ENVIRONMENT = register_tool_environment("ledger", episode=LedgerEpisode, tasks=TaskStore(TASKS, env="ledger"),
                                        description="a bookkeeping engine with its own executor (tests' plug-in)",
                                        example_task_id="ledger_0")
