"""The ``errands`` plug-in environment (``tests/plugins/errands_env.py``): every task's ground truth
plays to a pass through the service, a perturbed ground truth fails, each domain error of the two
apps is reported as a tool error without changing anything, the environment registers and serves
its splits, and ``errands.yaml`` is the quickstart recipe with only the environment changed."""

from __future__ import annotations

import copy
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from env_service.client import EnvClient
from env_service.kit import ToolBox, ground_truth_replies, parse_call
from env_service.registry import known_environments, unregister_environment
from seal_shared.calls import call_to_string

PLUGINS = Path(__file__).resolve().parent
ROOT = PLUGINS.parents[1]
CONF = PLUGINS / "errands.yaml"
READS = {"find_prescriptions", "check_stock", "list_orders", "search_books", "member_account"}


@pytest.fixture(scope="module")
def errands() -> Iterator[ModuleType]:
    """``errands_env`` importable (on sys.path only, as ``seal.plugins`` needs it), imported fresh;
    the environment it registers is unregistered after."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(PLUGINS))
        sys.modules.pop("errands_env", None)
        yield importlib.import_module("errands_env")
        unregister_environment("errands")
        sys.modules.pop("errands_env", None)


def judge(module: ModuleType, task_id: str, gt_turns: list[list[str]]) -> dict[str, Any]:
    """The evaluation of a model that made ``gt_turns``' calls, one step per turn (none on an empty one)."""
    task = module.load_tasks().get(task_id)
    return module.ErrandsEpisode.judge_turns(task, [[list(calls)] if calls else [] for calls in gt_turns])


def all_turns(module: ModuleType) -> list[tuple[str, list[list[str]]]]:
    """Every task's id and ground-truth calls per turn, as lists a test may perturb."""
    store = module.load_tasks()
    return [(tid, [list(calls) for calls in store.get(tid).gt_turns]) for tid in store.ids()]


# ----- the task file ---------------------------------------------------------------------------

def test_task_file_has_the_promised_splits_and_categories(errands: ModuleType) -> None:
    rows = errands.task_rows()
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        counts[row["category"], row["split"]] = counts.get((row["category"], row["split"]), 0) + 1
        assert 1 <= len(row["turns"]) <= 3, row["id"]
    categories = {"pharmacy", "library", "cross_domain", "no_call"}
    assert counts == {(c, s): n for c in categories for s, n in (("train", 12), ("val", 3), ("test", 3))}
    assert len({row["id"] for row in rows}) == len(rows) == len(errands.load_tasks()) == 72
    for row in rows:  # a no_call task has a turn whose right move is no call; no other task has one
        assert any(not turn["calls"] for turn in row["turns"]) == (row["category"] == "no_call"), row["id"]


def test_ground_truth_uses_the_tools_as_documented_and_never_fails(errands: ModuleType) -> None:
    """Every ground-truth call names its arguments, is accepted by the executor and hits no domain
    error: a task never asks the model to reproduce a failure."""
    for task_id, turns in all_turns(errands):
        world = errands.ErrandsEpisode(errands.load_tasks().get(task_id)).start()
        for calls in turns:
            for call in calls:
                assert not parse_call(call).args, (task_id, call)
                result = world.run(call)
                assert result.executed and not result.failed, (task_id, call, result.text)


# ----- registration and the served ground truth -------------------------------------------------

def test_registers_and_serves_its_splits(errands: ModuleType) -> None:
    assert "errands" in known_environments()
    rows = errands.task_rows()
    with EnvClient.in_process(env="errands", plugins=["errands_env"]) as client:
        for split in ("train", "val"):
            assert client.get_env_profile(split) == [r["id"] for r in rows if r["split"] == split]
        catalogue = client.catalogue()
    assert catalogue.categories == {r["id"]: r["category"] for r in rows}
    assert set(catalogue.interface_blocks) == {"observation_lite", "tool_feedback_evolution", "diagnostic_evolution"}
    assert catalogue.tool_parameters["order_refill"] == ["rx_id", "pickup_date", "quantity", "delivery"]


def test_every_task_ground_truth_plays_to_a_pass_in_process(errands: ModuleType) -> None:
    store = errands.load_tasks()
    with EnvClient.in_process(env="errands", plugins=["errands_env"]) as client:
        for task_id in store.ids():
            created = client.create(task_id, {"rollout_mode": "validate"})
            rewards = [client.step(created.instance_id, reply).reward
                       for reply in ground_truth_replies(store.get(task_id))]
            result = client.evaluate(created.instance_id, sparse=False)
            client.release(created.instance_id)
            assert rewards[-1] == 1.0 and result["valid"] is True, (task_id, result)
            assert set(result["failure_tags"]) <= {"pass", "correct_abstention"}, (task_id, result["failure_tags"])


def test_an_episode_that_only_chats_fails(errands: ModuleType) -> None:
    with EnvClient.in_process(env="errands", plugins=["errands_env"]) as client:
        created = client.create("errands_00", {"rollout_mode": "validate"})
        reward = client.step(created.instance_id, "I have ordered it for you.").reward
        result = client.evaluate(created.instance_id, sparse=False)
    assert reward == 0.0 and result["failure_tags"] == ["empty_turn_model_response"]


# ----- perturbed ground truth -------------------------------------------------------------------

def test_dropping_any_ground_truth_call_fails(errands: ModuleType) -> None:
    """No ground-truth call is redundant: without any one of them the episode fails (a missing write
    changes the state, a missing read leaves a ground-truth result unseen)."""
    tried = 0
    for task_id, turns in all_turns(errands):
        assert judge(errands, task_id, turns)["valid"] is True, task_id
        for k, calls in enumerate(turns):
            for i in range(len(calls)):
                perturbed = copy.deepcopy(turns)
                del perturbed[k][i]
                assert judge(errands, task_id, perturbed)["valid"] is False, (task_id, k, calls[i])
                tried += 1
    assert tried > 150


def _bumped(call: str) -> str | None:
    """``call`` with its first integer argument plus one, or its first date a day later (``None``: no
    such argument)."""
    parsed = parse_call(call)
    for name, value in parsed.kwargs.items():
        if isinstance(value, int) and not isinstance(value, bool):
            return call_to_string(parsed.name, {**parsed.kwargs, name: value + 1})
        if name == "pickup_date":
            day = int(value[-2:]) + 1
            return call_to_string(parsed.name, {**parsed.kwargs, name: f"{value[:-2]}{day:02d}"})
    return None


def test_changing_any_argument_value_fails(errands: ModuleType) -> None:
    tried = 0
    for task_id, turns in all_turns(errands):
        for k, calls in enumerate(turns):
            for i, call in enumerate(calls):
                bumped = _bumped(call)
                if bumped is None:
                    continue
                perturbed = copy.deepcopy(turns)
                perturbed[k][i] = bumped
                assert judge(errands, task_id, perturbed)["valid"] is False, (task_id, bumped)
                tried += 1
    assert tried >= 100


def test_a_no_call_turn_fails_only_when_the_model_changes_something(errands: ModuleType) -> None:
    write, read = "order_refill(rx_id=107, pickup_date='2024-06-05', quantity=1)", "member_account(card=5001)"
    for task_id, turns in all_turns(errands):
        for k, calls in enumerate(turns):
            if calls:
                continue
            with_write, with_read = copy.deepcopy(turns), copy.deepcopy(turns)
            with_write[k], with_read[k] = [write], [read]
            result = judge(errands, task_id, with_write)
            assert result["valid"] is False and result["failed_turn"] == k, task_id
            result = judge(errands, task_id, with_read)
            assert result["valid"] is True and result["failure_tags"][k] == "spurious_tool_call", task_id


# ----- the two apps -----------------------------------------------------------------------------

PHARMACY_ERRORS = [
    ("find_prescriptions", {"patient": "Zoe Quinn"}, "no patient named"),
    ("check_stock", {"drug": "ibuprofen"}, "does not carry"),
    ("order_refill", {"rx_id": 999, "pickup_date": "2024-06-05"}, "no prescription 999"),
    ("order_refill", {"rx_id": 102, "pickup_date": "2024-06-05", "delivery": "drone"}, "delivery must be one of"),
    ("order_refill", {"rx_id": 102, "pickup_date": "next friday"}, "is not a YYYY-MM-DD date"),
    ("order_refill", {"rx_id": 102, "pickup_date": "2024-06-02"}, "is in the past"),
    ("order_refill", {"rx_id": 102, "pickup_date": "2024-06-18"}, "more than 14 days ahead"),
    ("order_refill", {"rx_id": 102, "pickup_date": "2024-06-09"}, "closed on Sundays"),
    ("order_refill", {"rx_id": 101, "pickup_date": "2024-06-05"}, "no refills left"),
    ("order_refill", {"rx_id": 102, "pickup_date": "2024-06-05", "quantity": 31}, "quantity must be between 1 and 30"),
    ("order_refill", {"rx_id": 102, "pickup_date": "2024-06-05", "quantity": 0}, "quantity must be between 1 and 30"),
    ("order_refill", {"rx_id": 104, "pickup_date": "2024-06-05"}, "only 25 units of atorvastatin in stock"),
    ("list_orders", {"patient": "Nobody"}, "no patient named"),
    ("reschedule_order", {"order_id": 9, "pickup_date": "2024-06-05"}, "no order 9"),
    ("reschedule_order", {"order_id": 1, "pickup_date": "2024-06-16"}, "closed on Sundays"),
    ("cancel_order", {"order_id": 9}, "no order 9"),
    ("request_renewal", {"rx_id": 999}, "no prescription 999"),
    ("request_renewal", {"rx_id": 102}, "still has 3 refills"),
]
LIBRARY_ERRORS = [
    ("search_books", {"query": " d "}, "at least 2 characters"),
    ("member_account", {"card": 4999}, "no library card 4999"),
    ("borrow_book", {"card": 4999, "book_id": 3}, "no library card 4999"),
    ("borrow_book", {"card": 5001, "book_id": 99}, "no book with id 99"),
    ("borrow_book", {"card": 5001, "book_id": 3, "weeks": 5}, "weeks must be between 1 and 4"),
    ("borrow_book", {"card": 5005, "book_id": 3}, "350 cents of unpaid fines"),
    ("borrow_book", {"card": 5006, "book_id": 3}, "already has 3 books on loan"),
    ("borrow_book", {"card": 5001, "book_id": 1}, "no copy of book 1 on the shelf"),
    ("return_book", {"loan_id": 99}, "no open loan 99"),
    ("renew_loan", {"loan_id": 99}, "no open loan 99"),
    ("renew_loan", {"loan_id": 1, "weeks": 0}, "weeks must be between 1 and 4"),
    ("renew_loan", {"loan_id": 2}, "is overdue since 2024-05-30"),
    ("renew_loan", {"loan_id": 3}, "already renewed 2 times"),
    ("renew_loan", {"loan_id": 4}, "another member holds book 1"),
    ("place_hold", {"card": 5002, "book_id": 99}, "no book with id 99"),
    ("place_hold", {"card": 5002, "book_id": 1, "branch": "harbour"}, "branch must be one of"),
    ("place_hold", {"card": 5002, "book_id": 3}, "is on the shelf; borrow it instead"),
    ("place_hold", {"card": 5004, "book_id": 1}, "has book 1 on loan already"),
    ("place_hold", {"card": 5001, "book_id": 10}, "already holds book 10"),
    ("pay_fine", {"card": 4999, "amount_cents": 10}, "no library card 4999"),
    ("pay_fine", {"card": 5005, "amount_cents": 0}, "must be positive"),
    ("pay_fine", {"card": 5005, "amount_cents": 351}, "owes only 350 cents"),
]


DOMAIN_ERRORS = PHARMACY_ERRORS + LIBRARY_ERRORS


@pytest.mark.parametrize(("tool", "kwargs", "message"), DOMAIN_ERRORS,
                         ids=[f"{i}-{tool}" for i, (tool, _, _) in enumerate(DOMAIN_ERRORS)])
def test_each_domain_error_is_a_tool_error_that_changes_nothing(errands: ModuleType, tool: str,
                                                                  kwargs: dict[str, Any], message: str) -> None:
    world = errands.ErrandsEpisode(errands.load_tasks().get("errands_00")).start()
    before = world.state()
    result = world.run(call_to_string(tool, kwargs))
    assert result.executed and result.tool_error and message in result.text, result.text
    assert world.state() == before


def test_a_cancelled_order_and_a_pending_renewal_refuse_a_second_time(errands: ModuleType) -> None:
    pharmacy = errands.Pharmacy()
    assert "error" not in pharmacy.cancel_order(order_id=2)
    assert "already cancelled" in pharmacy.cancel_order(order_id=2)["error"]
    assert "is cancelled" in pharmacy.reschedule_order(order_id=2, pickup_date="2024-06-05")["error"]
    assert pharmacy.request_renewal(rx_id=101, urgent=True)["status"] == "sent to prescriber"
    assert "already pending" in pharmacy.request_renewal(rx_id=101)["error"]


def test_pharmacy_orders_move_stock_and_refills_both_ways(errands: ModuleType) -> None:
    pharmacy = errands.Pharmacy()
    order = pharmacy.order_refill(rx_id=108, pickup_date="2024-6-4", quantity=14, delivery="courier")
    assert order["order_id"] == 3 and order["pickup_date"] == "2024-06-04" and order["refills_left"] == 1
    assert pharmacy.check_stock(drug="Omeprazole") == {"drug": "omeprazole", "units": 6}
    pharmacy.cancel_order(order_id=3)
    assert pharmacy.state() == errands.Pharmacy().state() | {"orders": pharmacy.orders}
    listed = pharmacy.list_orders(patient="dev patel", include_cancelled=True)["orders"]
    assert [(o["order_id"], o["status"]) for o in listed] == [(1, "placed"), (3, "cancelled")]
    assert [o["order_id"] for o in pharmacy.list_orders(patient="Dev Patel")["orders"]] == [1]


def test_library_loans_fines_and_holds(errands: ModuleType) -> None:
    library = errands.Library()
    returned = library.return_book(loan_id=2)  # Dune, due 2024-05-30, returned on Monday 2024-06-03
    assert (returned["late_days"], returned["fine_cents"], returned["fines_cents"]) == (4, 100, 100)
    assert library.renew_loan(loan_id=1, weeks=3)["due_date"] == "2024-07-01"
    library.pay_fine(card=5005, amount_cents=350)
    assert "error" not in library.return_book(loan_id=5)  # a copy of Piranesi back on the shelf
    loan = library.borrow_book(card=5001, book_id=10, weeks=1)  # Ana held it: her hold closes
    assert loan["due_date"] == "2024-06-10" and library.member_account(card=5001)["holds"] == []
    assert [b["book_id"] for b in library.search_books(query="herbert", available_only=True)["books"]] == [1, 2]
    assert [b["book_id"] for b in errands.Library().search_books(query="HERBERT", available_only=True)["books"]] == [2]
    assert [b["book_id"] for b in errands.Library().search_books(query="dune")["books"]] == [1, 2]


def test_the_tool_docs_show_every_tool_with_its_arguments(errands: ModuleType) -> None:
    docs = {d["name"]: d for d in errands.load_tasks().get("errands_00").tools}
    assert len(docs) == 14 and READS < set(docs)
    borrow = docs["borrow_book"]["parameters"]
    assert borrow["required"] == ["card", "book_id"] and borrow["properties"]["weeks"]["type"] == "integer"
    assert "'courier'" in docs["order_refill"]["parameters"]["properties"]["delivery"]["description"]
    assert isinstance(ToolBox({"p": errands.Pharmacy()}).state()["p"]["stock"], dict)


# ----- the experiment config --------------------------------------------------------------------

def _composed(conf: Path, overrides: list[str]) -> dict[str, Any]:
    """``conf`` composed by Hydra as the launcher does, without the config check."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from seal import schema
    from seal.config_base import EXP_DIR, verl_config_dir

    schema.register()
    root = EXP_DIR if conf.is_relative_to(EXP_DIR) else conf.parent
    searchpath = f"hydra.searchpath=[file://{verl_config_dir()},file://{EXP_DIR}]"
    with initialize_config_dir(config_dir=str(root), version_base=None):
        cfg = compose(config_name=conf.stem, overrides=[searchpath, *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def _differences(a: Any, b: Any, path: str = "") -> set[str]:
    """The dotted keys whose values differ between two plain config trees."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {d for key in set(a) | set(b) for d in _differences(a.get(key), b.get(key), f"{path}.{key}")}
    return set() if a == b else {path.lstrip(".")}


def test_the_config_is_the_quickstart_recipe_pointed_at_errands(errands: ModuleType) -> None:
    from seal.config import compose_config

    checked = compose_config(CONF, ["env_service.url=null"])  # the project's full config check passes
    assert checked.env_service.env == "errands" and list(checked.seal.plugins) == ["errands_env"]
    ours, quickstart = _composed(CONF, []), _composed(ROOT / "exp" / "quickstart.yaml", [])
    assert _differences(ours, quickstart) == {
        "trainer.experiment_name", "trainer.default_local_dir", "trainer.validation_data_dir",
        "actor_rollout_ref.rollout.trace.experiment_name", "env_service.env", "env_service.errands", "seal.plugins"}
    assert ours["env_service"]["errands"] == quickstart["env_service"][quickstart["env_service"]["env"]]
    assert ours["trainer"]["experiment_name"] == "errands_quickstart"
    assert ours["seal"]["warm_start"]["task_ids"] is None  # the warm start reads the environment's train split
