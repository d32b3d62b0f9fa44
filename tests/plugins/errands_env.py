"""The ``errands`` environment: a pharmacy counter and a public library, two everyday apps an
assistant runs errands in for a handful of people.

A plug-in written from ``docs/extending.md`` only: the tools are plain classes run by the kit's
``ToolBox``, the tasks live in ``errands_tasks.jsonl`` beside this module (one per line), and the
kit's default per-turn check (replay on two fresh worlds, compare ``state()`` and the results)
and verdict are used unchanged. Both apps are offered in every task, so a single-domain task still
makes the model pick its tools among the other app's.

The calendar is frozen: "today" is ``TODAY`` (a Monday), so that due dates, late fines and pickup
windows are the same in every run and on every replay.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
from pathlib import Path
from typing import Any

from env_service.kit import Task, TaskStore, ToolBox, ToolEpisode, register_tool_environment, tool_docs

TODAY = dt.date(2024, 6, 3)
PICKUP_WINDOW_DAYS = 14
DELIVERY_MODES = ("pickup", "courier")
BRANCHES = ("central", "riverside", "hilltop")
MAX_LOANS = 3
MAX_RENEWALS = 2
LATE_FEE_CENTS_PER_DAY = 25
TASKS_FILE = Path(__file__).with_name("errands_tasks.jsonl")

Result = dict[str, Any]


def _err(message: str) -> Result:
    """A domain failure, in the kit's declared tool-error shape."""
    return {"error": message}


def _parse_day(text: str) -> dt.date | None:
    """A ``YYYY-MM-DD`` date, or ``None`` for anything else (the model's typo is a tool error)."""
    try:
        return dt.datetime.strptime(text.strip(), "%Y-%m-%d").date()
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------------
# The pharmacy
# --------------------------------------------------------------------------------------------------

_PRESCRIPTIONS: dict[int, Result] = {
    101: {"patient": "Ana Silva", "drug": "amoxicillin", "strength": "500 mg", "quantity": 21, "refills_left": 0},
    102: {"patient": "Ana Silva", "drug": "lisinopril", "strength": "10 mg", "quantity": 30, "refills_left": 3},
    103: {"patient": "Ben Okafor", "drug": "metformin", "strength": "850 mg", "quantity": 60, "refills_left": 5},
    104: {"patient": "Ben Okafor", "drug": "atorvastatin", "strength": "20 mg", "quantity": 30, "refills_left": 1},
    105: {"patient": "Chloe Martin", "drug": "salbutamol", "strength": "100 mcg inhaler", "quantity": 2,
          "refills_left": 2},
    106: {"patient": "Chloe Martin", "drug": "sertraline", "strength": "50 mg", "quantity": 30, "refills_left": 0},
    107: {"patient": "Dev Patel", "drug": "levothyroxine", "strength": "75 mcg", "quantity": 30, "refills_left": 4},
    108: {"patient": "Dev Patel", "drug": "omeprazole", "strength": "20 mg", "quantity": 28, "refills_left": 2},
    109: {"patient": "Eva Novak", "drug": "metformin", "strength": "500 mg", "quantity": 60, "refills_left": 2},
    110: {"patient": "Eva Novak", "drug": "amlodipine", "strength": "5 mg", "quantity": 30, "refills_left": 0},
    111: {"patient": "Farid Haddad", "drug": "atorvastatin", "strength": "40 mg", "quantity": 30, "refills_left": 3},
    112: {"patient": "Farid Haddad", "drug": "lisinopril", "strength": "20 mg", "quantity": 30, "refills_left": 1},
}
_STOCK = {"amlodipine": 90, "amoxicillin": 40, "atorvastatin": 25, "levothyroxine": 90, "lisinopril": 50,
          "metformin": 150, "omeprazole": 20, "salbutamol": 6, "sertraline": 60}
_ORDERS: dict[int, Result] = {
    1: {"rx_id": 107, "quantity": 30, "pickup_date": "2024-06-05", "delivery": "pickup", "status": "placed"},
    2: {"rx_id": 103, "quantity": 60, "pickup_date": "2024-06-04", "delivery": "courier", "status": "placed"},
}


class Pharmacy:
    """The pharmacy counter: prescriptions with refills, stock by drug, refill orders and renewal
    requests sent to prescribers. Today is 2024-06-03; the pharmacy is closed on Sundays."""

    def __init__(self) -> None:
        self.prescriptions = copy.deepcopy(_PRESCRIPTIONS)
        self.stock = dict(_STOCK)
        self.orders = copy.deepcopy(_ORDERS)
        self.renewals: dict[int, Result] = {}

    def state(self) -> dict[str, Any]:
        """Everything a request can change; compared with the ground truth's after every turn."""
        return copy.deepcopy({"prescriptions": self.prescriptions, "stock": self.stock, "orders": self.orders,
                              "renewals": self.renewals})

    def _patient(self, name: str) -> str | None:
        """The patient's name as filed, matched without regard to case or surrounding spaces."""
        wanted = name.strip().lower()
        return next((rx["patient"] for rx in self.prescriptions.values() if rx["patient"].lower() == wanted), None)

    def _order_view(self, order_id: int) -> Result:
        """An order as the tools answer it: with its id, patient and drug, so no second lookup is needed."""
        order = self.orders[order_id]
        rx = self.prescriptions[order["rx_id"]]
        return {"order_id": order_id, **order, "patient": rx["patient"], "drug": rx["drug"]}

    @staticmethod
    def _pickup_day(pickup_date: str) -> tuple[str, str | None]:
        """``(the date written YYYY-MM-DD, None)``, or ``("", why it cannot be booked)``: the window is
        today to 14 days ahead, and no Sundays. The date is stored normalized, so '2024-6-5' and
        '2024-06-05' book the same day."""
        day = _parse_day(pickup_date)
        if day is None:
            return "", f"pickup_date {pickup_date!r} is not a YYYY-MM-DD date"
        if day < TODAY:
            return "", f"pickup_date {day} is in the past (today is {TODAY})"
        if (day - TODAY).days > PICKUP_WINDOW_DAYS:
            return "", f"pickup_date {day} is more than {PICKUP_WINDOW_DAYS} days ahead"
        if day.weekday() == 6:
            return "", f"the pharmacy is closed on Sundays ({day})"
        return day.isoformat(), None

    def find_prescriptions(self, patient: str) -> Result:
        """List a patient's prescriptions with their ids, quantity per fill and refills left.

        Args:
            patient: the patient's full name, e.g. 'Ana Silva'.
        """
        name = self._patient(patient)
        if name is None:
            return _err(f"no patient named {patient!r}")
        found = [{"rx_id": rx_id, **{k: v for k, v in rx.items() if k != "patient"}}
                 for rx_id, rx in sorted(self.prescriptions.items()) if rx["patient"] == name]
        return {"patient": name, "prescriptions": found}

    def check_stock(self, drug: str) -> Result:
        """Units of a drug on the shelf (all strengths together).

        Args:
            drug: the drug's generic name, e.g. 'metformin'.
        """
        key = drug.strip().lower()
        if key not in self.stock:
            return _err(f"the pharmacy does not carry {drug!r}")
        return {"drug": key, "units": self.stock[key]}

    def order_refill(self, rx_id: int, pickup_date: str, quantity: int | None = None,
                     delivery: str = "pickup") -> Result:
        """Order one refill of a prescription; it uses one refill and takes the units from stock.

        Args:
            rx_id: the prescription id.
            pickup_date: YYYY-MM-DD, today (2024-06-03) to 14 days ahead, not a Sunday (courier: delivery day).
            quantity: units to dispense, at most the prescription's quantity per fill; null = the full quantity.
            delivery: 'pickup' (at the counter) or 'courier' (to the patient's home).
        """
        rx = self.prescriptions.get(rx_id)
        if rx is None:
            return _err(f"no prescription {rx_id}")
        if delivery not in DELIVERY_MODES:
            return _err(f"delivery must be one of {', '.join(DELIVERY_MODES)}, got {delivery!r}")
        day, problem = self._pickup_day(pickup_date)
        if problem:
            return _err(problem)
        if rx["refills_left"] == 0:
            return _err(f"prescription {rx_id} has no refills left; request a renewal from the prescriber")
        units = rx["quantity"] if quantity is None else quantity
        if not 1 <= units <= rx["quantity"]:
            return _err(f"quantity must be between 1 and {rx['quantity']} for prescription {rx_id}, got {units}")
        if self.stock[rx["drug"]] < units:
            return _err(f"only {self.stock[rx['drug']]} units of {rx['drug']} in stock, {units} asked")
        self.stock[rx["drug"]] -= units
        rx["refills_left"] -= 1
        order_id = max(self.orders, default=0) + 1
        self.orders[order_id] = {"rx_id": rx_id, "quantity": units, "pickup_date": day,
                                 "delivery": delivery, "status": "placed"}
        return {**self._order_view(order_id), "refills_left": rx["refills_left"]}

    def list_orders(self, patient: str, include_cancelled: bool = False) -> Result:
        """List a patient's refill orders.

        Args:
            patient: the patient's full name.
            include_cancelled: also list cancelled orders.
        """
        name = self._patient(patient)
        if name is None:
            return _err(f"no patient named {patient!r}")
        orders = [self._order_view(oid) for oid in sorted(self.orders)
                  if self.prescriptions[self.orders[oid]["rx_id"]]["patient"] == name
                  and (include_cancelled or self.orders[oid]["status"] != "cancelled")]
        return {"patient": name, "orders": orders}

    def reschedule_order(self, order_id: int, pickup_date: str) -> Result:
        """Move a placed order to another pickup (or courier) date.

        Args:
            order_id: the order id.
            pickup_date: the new YYYY-MM-DD date, within the same window as order_refill.
        """
        if order_id not in self.orders:
            return _err(f"no order {order_id}")
        if self.orders[order_id]["status"] == "cancelled":
            return _err(f"order {order_id} is cancelled")
        day, problem = self._pickup_day(pickup_date)
        if problem:
            return _err(problem)
        self.orders[order_id]["pickup_date"] = day
        return self._order_view(order_id)

    def cancel_order(self, order_id: int) -> Result:
        """Cancel a placed order: its units go back to stock and its refill back to the prescription.

        Args:
            order_id: the order id.
        """
        order = self.orders.get(order_id)
        if order is None:
            return _err(f"no order {order_id}")
        if order["status"] == "cancelled":
            return _err(f"order {order_id} is already cancelled")
        rx = self.prescriptions[order["rx_id"]]
        order["status"] = "cancelled"
        self.stock[rx["drug"]] += order["quantity"]
        rx["refills_left"] += 1
        return self._order_view(order_id)

    def request_renewal(self, rx_id: int, urgent: bool = False) -> Result:
        """Ask the prescriber to renew a prescription that has no refills left.

        Args:
            rx_id: the prescription id.
            urgent: flag the request as urgent for the prescriber.
        """
        rx = self.prescriptions.get(rx_id)
        if rx is None:
            return _err(f"no prescription {rx_id}")
        if rx["refills_left"] > 0:
            return _err(f"prescription {rx_id} still has {rx['refills_left']} refills; order a refill instead")
        if rx_id in self.renewals:
            return _err(f"a renewal of prescription {rx_id} is already pending")
        self.renewals[rx_id] = {"urgent": urgent, "status": "sent"}
        return {"rx_id": rx_id, "drug": rx["drug"], "urgent": urgent, "status": "sent to prescriber"}


# --------------------------------------------------------------------------------------------------
# The library
# --------------------------------------------------------------------------------------------------

_MEMBERS: dict[int, Result] = {
    5001: {"name": "Ana Silva", "fines_cents": 0}, 5002: {"name": "Ben Okafor", "fines_cents": 0},
    5003: {"name": "Chloe Martin", "fines_cents": 0}, 5004: {"name": "Dev Patel", "fines_cents": 0},
    5005: {"name": "Eva Novak", "fines_cents": 350}, 5006: {"name": "Farid Haddad", "fines_cents": 0},
}
_BOOKS: dict[int, Result] = {
    1: {"title": "Dune", "author": "Frank Herbert", "copies_on_shelf": 0},
    2: {"title": "Dune Messiah", "author": "Frank Herbert", "copies_on_shelf": 1},
    3: {"title": "The Hobbit", "author": "J. R. R. Tolkien", "copies_on_shelf": 2},
    4: {"title": "Beloved", "author": "Toni Morrison", "copies_on_shelf": 1},
    5: {"title": "The Road", "author": "Cormac McCarthy", "copies_on_shelf": 0},
    6: {"title": "Educated", "author": "Tara Westover", "copies_on_shelf": 2},
    7: {"title": "Circe", "author": "Madeline Miller", "copies_on_shelf": 1},
    8: {"title": "Sapiens", "author": "Yuval Noah Harari", "copies_on_shelf": 1},
    9: {"title": "Persuasion", "author": "Jane Austen", "copies_on_shelf": 2},
    10: {"title": "Piranesi", "author": "Susanna Clarke", "copies_on_shelf": 0},
    11: {"title": "Atonement", "author": "Ian McEwan", "copies_on_shelf": 1},
    12: {"title": "Middlemarch", "author": "George Eliot", "copies_on_shelf": 1},
}
_LOANS: dict[int, Result] = {
    1: {"card": 5001, "book_id": 5, "due_date": "2024-06-10", "renewals": 0},
    2: {"card": 5002, "book_id": 1, "due_date": "2024-05-30", "renewals": 1},
    3: {"card": 5003, "book_id": 10, "due_date": "2024-06-14", "renewals": 2},
    4: {"card": 5004, "book_id": 1, "due_date": "2024-06-12", "renewals": 0},
    5: {"card": 5005, "book_id": 10, "due_date": "2024-06-20", "renewals": 0},
    6: {"card": 5006, "book_id": 5, "due_date": "2024-06-05", "renewals": 1},
    7: {"card": 5004, "book_id": 6, "due_date": "2024-06-07", "renewals": 0},
    8: {"card": 5006, "book_id": 8, "due_date": "2024-06-18", "renewals": 0},
    9: {"card": 5006, "book_id": 9, "due_date": "2024-05-31", "renewals": 0},
}
_HOLDS: dict[int, Result] = {
    1: {"card": 5001, "book_id": 10, "branch": "riverside"},
    2: {"card": 5003, "book_id": 1, "branch": "hilltop"},
}


class Library:
    """The public library: members by card number, the catalogue with copies on the shelf, loans
    (3 at most per card, 2 renewals each, 25 cents a day when late) and holds at three branches."""

    def __init__(self) -> None:
        self.members = copy.deepcopy(_MEMBERS)
        self.books = copy.deepcopy(_BOOKS)
        self.loans = copy.deepcopy(_LOANS)
        self.holds = copy.deepcopy(_HOLDS)

    def state(self) -> dict[str, Any]:
        """Everything a request can change; compared with the ground truth's after every turn."""
        return copy.deepcopy({"members": self.members, "books": self.books, "loans": self.loans,
                              "holds": self.holds})

    def _loan_view(self, loan_id: int) -> Result:
        """A loan as the tools answer it: with its id and the book's title."""
        loan = self.loans[loan_id]
        return {"loan_id": loan_id, "card": loan["card"], "book_id": loan["book_id"],
                "title": self.books[loan["book_id"]]["title"], "due_date": loan["due_date"],
                "renewals": loan["renewals"]}

    def _missing(self, card: int | None = None, book_id: int | None = None) -> Result | None:
        """The error for an unknown card or book id, or ``None`` when both are known."""
        if card is not None and card not in self.members:
            return _err(f"no library card {card}")
        if book_id is not None and book_id not in self.books:
            return _err(f"no book with id {book_id}")
        return None

    def search_books(self, query: str, available_only: bool = False) -> Result:
        """Search the catalogue by words of the title or the author's name.

        Args:
            query: part of a title or an author's name (case does not matter), at least 2 characters.
            available_only: list only books with a copy on the shelf now.
        """
        text = query.strip().lower()
        if len(text) < 2:
            return _err("query must have at least 2 characters")
        found = [{"book_id": book_id, **book} for book_id, book in sorted(self.books.items())
                 if (text in book["title"].lower() or text in book["author"].lower())
                 and (book["copies_on_shelf"] > 0 or not available_only)]
        return {"query": query, "books": found}

    def member_account(self, card: int) -> Result:
        """A member's account: name, unpaid fines, current loans and holds.

        Args:
            card: the library card number.
        """
        missing = self._missing(card=card)
        if missing:
            return missing
        member = self.members[card]
        loans = [self._loan_view(lid) for lid in sorted(self.loans) if self.loans[lid]["card"] == card]
        holds = [{"hold_id": hid, "book_id": h["book_id"], "title": self.books[h["book_id"]]["title"],
                  "branch": h["branch"]} for hid, h in sorted(self.holds.items()) if h["card"] == card]
        return {"card": card, "name": member["name"], "fines_cents": member["fines_cents"], "loans": loans,
                "holds": holds}

    def borrow_book(self, card: int, book_id: int, weeks: int = 3) -> Result:
        """Lend a copy from the shelf to a member; the member's own hold on the book is then closed.

        Args:
            card: the library card number.
            book_id: the book id from search_books.
            weeks: loan length in weeks, 1 to 4.
        """
        missing = self._missing(card=card, book_id=book_id)
        if missing:
            return missing
        if not 1 <= weeks <= 4:
            return _err(f"weeks must be between 1 and 4, got {weeks}")
        fines = self.members[card]["fines_cents"]
        if fines > 0:
            return _err(f"card {card} has {fines} cents of unpaid fines; pay them before borrowing")
        current = [loan for loan in self.loans.values() if loan["card"] == card]
        if len(current) >= MAX_LOANS:
            return _err(f"card {card} already has {MAX_LOANS} books on loan")
        if any(loan["book_id"] == book_id for loan in current):
            return _err(f"card {card} already has book {book_id} on loan")
        if self.books[book_id]["copies_on_shelf"] == 0:
            return _err(f"no copy of book {book_id} on the shelf; place a hold instead")
        self.books[book_id]["copies_on_shelf"] -= 1
        self.holds = {hid: h for hid, h in self.holds.items() if (h["card"], h["book_id"]) != (card, book_id)}
        loan_id = max(self.loans, default=0) + 1
        due = TODAY + dt.timedelta(weeks=weeks)
        self.loans[loan_id] = {"card": card, "book_id": book_id, "due_date": due.isoformat(), "renewals": 0}
        return self._loan_view(loan_id)

    def return_book(self, loan_id: int) -> Result:
        """Check a loaned copy back in; a late return adds 25 cents a day to the member's fines.

        Args:
            loan_id: the loan id (see member_account).
        """
        if loan_id not in self.loans:
            return _err(f"no open loan {loan_id}")
        loan = self.loans.pop(loan_id)
        late_days = max(0, (TODAY - dt.date.fromisoformat(loan["due_date"])).days)
        fine = late_days * LATE_FEE_CENTS_PER_DAY
        self.members[loan["card"]]["fines_cents"] += fine
        self.books[loan["book_id"]]["copies_on_shelf"] += 1
        return {"loan_id": loan_id, "card": loan["card"], "title": self.books[loan["book_id"]]["title"],
                "late_days": late_days, "fine_cents": fine, "fines_cents": self.members[loan["card"]]["fines_cents"]}

    def renew_loan(self, loan_id: int, weeks: int = 2) -> Result:
        """Extend a loan from its current due date; not for overdue loans, loans renewed twice already,
        or books another member holds.

        Args:
            loan_id: the loan id.
            weeks: extension in weeks, 1 to 4.
        """
        if loan_id not in self.loans:
            return _err(f"no open loan {loan_id}")
        if not 1 <= weeks <= 4:
            return _err(f"weeks must be between 1 and 4, got {weeks}")
        loan = self.loans[loan_id]
        due = dt.date.fromisoformat(loan["due_date"])
        if due < TODAY:
            return _err(f"loan {loan_id} is overdue since {loan['due_date']}; return the book instead")
        if loan["renewals"] >= MAX_RENEWALS:
            return _err(f"loan {loan_id} was already renewed {MAX_RENEWALS} times")
        if any(h["book_id"] == loan["book_id"] and h["card"] != loan["card"] for h in self.holds.values()):
            return _err(f"another member holds book {loan['book_id']}; the loan cannot be renewed")
        loan["due_date"] = (due + dt.timedelta(weeks=weeks)).isoformat()
        loan["renewals"] += 1
        return self._loan_view(loan_id)

    def place_hold(self, card: int, book_id: int, branch: str = "central") -> Result:
        """Reserve the next returned copy of a book with no copy on the shelf.

        Args:
            card: the library card number.
            book_id: the book id from search_books.
            branch: where to collect it: 'central', 'riverside' or 'hilltop'.
        """
        missing = self._missing(card=card, book_id=book_id)
        if missing:
            return missing
        if branch not in BRANCHES:
            return _err(f"branch must be one of {', '.join(BRANCHES)}, got {branch!r}")
        if self.books[book_id]["copies_on_shelf"] > 0:
            return _err(f"a copy of book {book_id} is on the shelf; borrow it instead")
        if any(loan["card"] == card and loan["book_id"] == book_id for loan in self.loans.values()):
            return _err(f"card {card} has book {book_id} on loan already")
        if any(h["card"] == card and h["book_id"] == book_id for h in self.holds.values()):
            return _err(f"card {card} already holds book {book_id}")
        hold_id = max(self.holds, default=0) + 1
        self.holds[hold_id] = {"card": card, "book_id": book_id, "branch": branch}
        return {"hold_id": hold_id, "card": card, "book_id": book_id, "title": self.books[book_id]["title"],
                "branch": branch}

    def pay_fine(self, card: int, amount_cents: int) -> Result:
        """Pay part or all of a member's unpaid fines.

        Args:
            card: the library card number.
            amount_cents: the amount in cents, more than 0 and at most what is owed.
        """
        missing = self._missing(card=card)
        if missing:
            return missing
        owed = self.members[card]["fines_cents"]
        if amount_cents <= 0:
            return _err(f"amount_cents must be positive, got {amount_cents}")
        if amount_cents > owed:
            return _err(f"card {card} owes only {owed} cents")
        self.members[card]["fines_cents"] = owed - amount_cents
        return {"card": card, "paid_cents": amount_cents, "fines_cents": owed - amount_cents}


# --------------------------------------------------------------------------------------------------
# Tasks, episode, registration
# --------------------------------------------------------------------------------------------------

TOOL_CLASSES = (Pharmacy, Library)


def make_task(row: dict[str, Any]) -> Task:
    """One task from one line of ``errands_tasks.jsonl``: ``turns`` is a list of ``{user, calls}``."""
    turns = row["turns"]
    return Task(id=row["id"], category=row["category"], split=row["split"],
                user_turns=[turn["user"] for turn in turns], gt_turns=[list(turn["calls"]) for turn in turns],
                tools=tool_docs(TOOL_CLASSES))


@functools.cache
def load_tasks() -> TaskStore:
    """Every task, read once, on the environment's first use (so importing the module is cheap)."""
    return TaskStore.from_jsonl(TASKS_FILE, make_task, env="errands")


def task_rows() -> list[dict[str, Any]]:
    """The raw lines of the task file (the tests read the categories and turns from them)."""
    with TASKS_FILE.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class ErrandsEpisode(ToolEpisode):
    """One rollout: the kit's protocol on a fresh pharmacy and library. The params are the kit's
    default ``InterfaceParams``, so the recipe's interface-evolution blocks apply."""

    def start(self) -> ToolBox:
        """Fresh apps for every episode and every replay of the check: nothing is shared."""
        return ToolBox({"pharmacy": Pharmacy(), "library": Library()})


ENVIRONMENT = register_tool_environment(
    "errands", episode=ErrandsEpisode, tasks=load_tasks,
    description="errands at a pharmacy counter and a public library (tests' plug-in environment)",
    example_task_id="errands_00")
