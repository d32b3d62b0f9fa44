"""The generated test tasks of ``notes`` (``tasks_test.jsonl``): 110 tasks, ids ``notes_100`` up.

The 100 hand-written tasks (``tasks.jsonl``) hold only 10 test tasks, too few to measure a policy;
these are the rest of the held-out test split. They are generated, not hand-written, so that their
number is cheap to raise and no one tuned them by looking at a model's episodes; the generator is
deterministic (one seeded :class:`random.Random` per task, no clock), so the committed file is what
``--write`` gives, and a test regenerates it byte for byte.

Each task starts the involved apps in a varied state (notes with titles, bodies, folders and tags;
to-do items with due dates, some done; calendar events over a few days) and has two or three user
turns in natural phrasing, several templates per action. Categories follow the hand-written val
split's shares (14 : 10 : 6): ``single_app`` (every turn one app), ``cross_app`` (two or three
apps), ``abstain`` (a turn whose right move is no call: a closing or a "not yet", a request the
apps cannot do, or a question the previous tool result already answered). Every referring
expression is resolvable from the conversation: an id the user names ("note 2"), an object the
previous turn created or found ("it"), or a title the previous turn's listing showed.

A drawn task is kept only if its ground truth passes the checker and every perturbation fails
(the last call of any turn dropped; any string argument changed), so no call of the ground truth is
redundant. ``python -m env_service.notes.generate --check`` compares the file with a fresh
generation; ``--write`` rewrites it.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from env_service.notes.checker import World, check_episode
from env_service.notes.episode import GENERATED_TASKS_FILE, NotesTask
from seal_shared.calls import call_to_string, parse_call

logger = logging.getLogger(__name__)

SEED = 20250611
FIRST_ID = 100
# The hand-written val split's category shares (14 single_app, 10 cross_app, 6 abstain of 30), of 110.
COUNTS: tuple[tuple[str, int], ...] = (("single_app", 51), ("cross_app", 37), ("abstain", 22))
APPS = ("NotesApp", "TodoList", "Calendar")
MAX_DRAWS = 200  # per task; a draw that fails the checks is redrawn from the same generator

# (title, body, folder, a query that finds this note alone)
NOTES = [
    ("Garden plan", "tomatoes by the south fence", "home", "tomatoes"),
    ("Reading list", "Middlemarch, then The Overstory", "books", "Middlemarch"),
    ("Boiler manual", "reset: hold the red button for 10 s", "home", "red button"),
    ("Team offsite", "venue: the old mill", "work", "old mill"),
    ("Bike fit", "saddle height 74 cm", "sport", "saddle"),
    ("Spanish verbs", "ser, estar, tener", "study", "estar"),
    ("Birthday gifts", "Noor: a cookbook", "personal", "cookbook"),
    ("Car insurance", "policy 88-1204 renews in March", "finance", "88-1204"),
    ("Sourdough", "feed the starter at 8 pm", "kitchen", "starter"),
    ("Podcast ideas", "an episode on night trains", "writing", "night trains"),
    ("Flat viewing", "Elm Street 12, second floor", "home", "Elm Street"),
    ("Conference talk", "slides on caching", "work", "caching"),
    ("Running log", "5 km in 27 minutes", "sport", "27 minutes"),
    ("Wedding toast", "start with the canoe story", "personal", "canoe"),
    ("Vet records", "rabies shot due in May", "health", "rabies"),
    ("Packing for Oslo", "wool socks, rain jacket", "travel", "wool socks"),
    ("Budget", "rent 950, food 300", "finance", "food 300"),
    ("Plant care", "water the fern on Sundays", "home", "fern"),
    ("Design review", "ship the new logo in July", "work", "logo"),
    ("Allergies", "no peanuts for Leo", "health", "peanuts"),
    ("Films to watch", "Paris, Texas", "personal", "Texas"),
    ("Chess openings", "Sicilian Najdorf", "study", "Najdorf"),
]
NEW_NOTES = [
    ("Paint colours", "hallway: sage green"), ("Lisbon tips", "take tram 28 early"),
    ("Quiz questions", "capital of Mongolia"), ("Soup recipe", "leek, potato, thyme"),
    ("Gift for Omar", "a fountain pen"), ("Marathon plan", "long run on Saturdays"),
    ("Meeting with Jo", "agree the Q4 roadmap"), ("Camping kit", "tent pegs, head torch"),
    ("Book club picks", "The Remains of the Day"), ("Wifi at the cabin", "network: pinewood"),
    ("Balcony herbs", "basil, mint, chives"), ("Interview prep", "questions about the team"),
]
FOLDERS = ["archive", "work", "personal", "travel", "home", "ideas", "finance", "drafts"]
TAGS = ["urgent", "later", "family", "q3", "shared", "important", "weekend", "draft"]
APPEND_LINES = ["check again on Friday", "ask Mia about it", "done by the end of June", "see the photo",
                "call before noon", "costs about 40 euros", "bring the receipt", "second copy at the office"]
TODOS = ["Renew the gym card", "Call the bank", "Buy printer ink", "Book a haircut", "Return the parcel",
         "Fix the bike light", "Order contact lenses", "Send the rent receipt", "Defrost the freezer",
         "Pay the phone bill", "Email the landlord", "Back up the laptop", "Sign the school form",
         "Clean the oven", "Update the CV", "Replace the smoke alarm battery"]
NEW_TODOS = ["Buy stamps", "Water the garden", "Cancel the magazine", "Book the vet", "Wrap the presents",
             "Pick up the photos", "Charge the camera", "Order a new kettle", "Renew the library books",
             "Check the tyre pressure", "Write to grandma", "Sort the recycling"]
EVENTS = ["Dentist", "Team standup", "Yoga class", "Dinner with Ana", "Piano lesson", "Haircut",
          "Parents evening", "Flight to Rome", "Book club", "Football practice", "Budget review",
          "Guitar lesson", "Swimming", "Coffee with Tom"]
NEW_EVENTS = ["Physio", "Lunch with Kai", "Sprint planning", "Concert", "Boat trip", "School play",
              "Vaccination", "Language exchange", "Bike repair", "Open day", "Board games night", "Tax advisor"]
TIMES = ["07:30", "08:00", "09:00", "09:30", "10:15", "11:00", "12:30", "13:00", "14:00", "15:30", "16:00",
         "17:45", "18:30", "19:00", "20:00"]
CLOSINGS = ["Thanks, that's all for now.", "Perfect, nothing else today.", "Great, that's everything - bye!",
            "Lovely, I'll take it from here.", "No more changes, thank you."]
HOLDS = ["Hi! I'll tell you what I need in a second - don't change anything yet.",
         "Hold on, let me check my diary first; no changes for now.",
         "Just thinking out loud about my week, no action needed."]
CANNOT = ["Can you send an email to my sister for me?", "Please text Ana that I'm running late.",
          "Set an alarm for 06:30 tomorrow morning.", "Could you call the dentist and confirm for me?",
          "Share my calendar with Tom, please.", "Book me a taxi to the airport.",
          "What will the weather be like this weekend?", "Play some relaxing music while I work."]


@dataclass
class _Sim:
    """One task being drawn: the apps' live state, the calls of the turn so far, and what the last
    action's result showed (``seen``: app and ids), which the next turn may refer to by pronoun or title."""

    rng: random.Random
    world: World
    month: int
    calls: list[str] = field(default_factory=list)
    dated: set[int] = field(default_factory=set)  # events whose date the conversation has shown
    seen: tuple[str, list[int]] = ("", [])
    listed: bool = False  # ``seen`` is a listing's (titles shown: an object may be named by its title)
    read: tuple[str, Any] | None = None  # the last read's method and what it showed (an answered question's source)

    def run(self, app: str, method: str, **kwargs: Any) -> dict[str, Any]:
        """Run one call on the live apps and record its call string."""
        self.calls.append(call_to_string(method, kwargs))
        result = getattr(self.world.apps[app], method)(**kwargs)
        if "error" in result:  # an action drew a call the apps refuse: a bug of this module
            raise RuntimeError(f"generated call {self.calls[-1]} failed: {result['error']}")
        return result

    def show(self, app: str, ids: list[int], *, listed: bool = False) -> None:
        """What this action's result showed, for the next action to refer to."""
        self.seen, self.listed = (app, ids), listed

    def objects(self, app: str) -> dict[int, dict[str, Any]]:
        key = {"NotesApp": "notes", "TodoList": "items", "Calendar": "events"}[app]
        return self.world.apps[app].state()[key]

    def date(self) -> str:
        return f"2025-{self.month + self.rng.randint(0, 1):02d}-{self.rng.randint(1, 28):02d}"

    def target(self, app: str, eligible: list[int]) -> tuple[int, str] | None:
        """An object to act on and how to name it: ``it`` (the one the last result showed), ``name``
        (one of several a listing showed, by its title) or ``id`` (the user names its id)."""
        if not eligible:
            return None
        shown = [i for i in self.seen[1] if i in eligible] if self.seen[0] == app else []
        if len(shown) == 1 and len(self.seen[1]) == 1:
            return shown[0], "it"
        if shown and self.listed:
            return self.rng.choice(shown), "name"
        return self.rng.choice(eligible), "id"

    def say(self, options: list[str], **fields: Any) -> str:
        return self.rng.choice(options).format(**fields)


# ----- actions: each returns the user's sentence (its calls are recorded on the sim) or None ------

def _create_note(sim: _Sim) -> str | None:
    titles = {n["title"] for n in sim.objects("NotesApp").values()}
    title, body = sim.rng.choice([n for n in NEW_NOTES if n[0] not in titles])
    if sim.rng.random() < 0.5:
        folder = sim.rng.choice(FOLDERS)
        text = sim.say(["Create a note '{t}' in the {f} folder with the text '{b}'.",
                        "Make a note called '{t}' in {f} that says '{b}'."], t=title, b=body, f=folder)
        result = sim.run("NotesApp", "create_note", title=title, body=body, folder=folder)
    else:
        text = sim.say(["Make a note titled '{t}' that says '{b}'.", "New note please: '{t}', with the text '{b}'.",
                        "Jot down a note '{t}': '{b}'."], t=title, b=body)
        result = sim.run("NotesApp", "create_note", title=title, body=body)
    sim.show("NotesApp", [result["note_id"]])
    return text


def _note_phrase(sim: _Sim, how: str, note_id: int) -> str:
    title = sim.objects("NotesApp")[note_id]["title"]
    return {"it": sim.rng.choice(["it", "that note"]), "name": f"the '{title}' note",
            "id": sim.rng.choice([f"note {note_id}", f"the {title} note (note {note_id})",
                                  f"note {note_id} ('{title}')"])}[how]


def _change_note(sim: _Sim) -> str | None:
    notes = sim.objects("NotesApp")
    picked = sim.target("NotesApp", list(notes))
    if picked is None:
        return None
    note_id, how = picked
    note, ref = notes[note_id], _note_phrase(sim, how, note_id)
    kind = sim.rng.choice(["append", "move", "tag", "delete"] if how != "it" or len(notes) > 1 else ["append", "tag"])
    if kind == "append":
        line = sim.rng.choice(APPEND_LINES)
        sim.run("NotesApp", "append_to_note", note_id=note_id, text=line)
        text = sim.say(["Add the line '{x}' to {r}.", "Append '{x}' to {r}.", "Could you add '{x}' at the end of {r}?"],
                       x=line, r=ref)
    elif kind == "move":
        folder = sim.rng.choice([f for f in FOLDERS if f != note["folder"]])
        sim.run("NotesApp", "move_note", note_id=note_id, folder=folder)
        text = sim.say(["Move {r} to the {f} folder.", "File {r} under {f}.", "Put {r} in {f}, please."],
                       r=ref, f=folder)
    elif kind == "tag":
        tag = sim.rng.choice([t for t in TAGS if t not in note["tags"]])
        sim.run("NotesApp", "tag_note", note_id=note_id, tag=tag)
        text = sim.say(["Tag {r} with '{g}'.", "Add the tag '{g}' to {r}.", "Label {r} '{g}'."], r=ref, g=tag)
    else:
        sim.run("NotesApp", "delete_note", note_id=note_id)
        text = sim.say(["Delete {r}, I don't need it any more.", "Please remove {r}.", "Get rid of {r}."], r=ref)
    sim.show("NotesApp", [note_id] if kind != "delete" else [])
    return text[0].upper() + text[1:]


def _read_notes(sim: _Sim) -> str | None:
    notes = sim.objects("NotesApp")
    folders = sorted({n["folder"] for n in notes.values()})
    kind = sim.rng.choice(["folder", "all", "search", "read"])
    if kind == "folder" and folders:
        folder = sim.rng.choice(folders)
        shown = [i for i, n in notes.items() if n["folder"] == folder]
        sim.run("NotesApp", "list_notes", folder=folder)
        sim.read = ("list_notes", (folder, len(shown)))
        text = sim.say(["Which notes do I have in the {f} folder?", "Show me the notes filed under {f}.",
                        "What's in my {f} folder?"], f=folder)
    elif kind == "all" and notes:
        shown = list(notes)
        sim.run("NotesApp", "list_notes")
        sim.read = ("list_notes", ("", len(shown)))
        text = sim.say(["List all of my notes.", "What notes do I have?", "Show me every note I've got."])
    elif kind == "search":
        unique = [(i, q) for i, n in notes.items() for t, _, _, q in NOTES if t == n["title"]]
        if not unique:
            return None
        note_id, query = sim.rng.choice(unique)
        shown = [note_id]
        sim.run("NotesApp", "search_notes", query=query)
        sim.read = ("search_notes", note_id)
        text = sim.say(["Search my notes for '{q}'.", "Find the note that mentions '{q}'.",
                        "Which note talks about '{q}'?"], q=query)
    else:
        if not notes:
            return None
        note_id = sim.rng.choice(list(notes))
        shown = [note_id]
        sim.run("NotesApp", "read_note", note_id=note_id)
        sim.read = ("read_note", note_id)
        text = sim.say(["What does note {i} say?", "Read me note {i}.", "Open note {i} and tell me what's in it."],
                       i=note_id)
    sim.show("NotesApp", shown, listed=sim.read[0] == "list_notes")
    return text


def _add_item(sim: _Sim) -> str | None:
    texts = {v["text"] for v in sim.objects("TodoList").values()}
    todo = sim.rng.choice([t for t in NEW_TODOS if t not in texts])
    if sim.rng.random() < 0.7:
        due = sim.date()
        result = sim.run("TodoList", "add_item", text=todo, due=due)
        text = sim.say(["Add '{t}' to my to-do list, due {d}.", "New to-do: '{t}', by {d}.",
                        "Put '{t}' on my list for {d}."], t=todo, d=due)
    else:
        result = sim.run("TodoList", "add_item", text=todo)
        text = sim.say(["Add '{t}' to my to-dos, no due date.", "Put '{t}' on the to-do list; there's no deadline."],
                       t=todo)
    sim.show("TodoList", [result["item_id"]])
    return text


def _change_item(sim: _Sim) -> str | None:
    items = sim.objects("TodoList")
    picked = sim.target("TodoList", [i for i, v in items.items() if not v["done"]])
    if picked is None:
        return None
    item_id, how = picked
    name = items[item_id]["text"]
    ref = {"it": sim.rng.choice(["it", "that one"]), "name": f"the '{name}' item",
           "id": sim.rng.choice([f"item {item_id}", f"item {item_id} ('{name}')",
                                 f"the '{name}' item (item {item_id})"])}[how]
    if sim.rng.random() < 0.65:
        sim.run("TodoList", "complete_item", item_id=item_id)
        text = sim.say(["Mark {r} as done.", "I've finished {r}; tick it off.", "Please check off {r}."], r=ref)
    else:
        sim.run("TodoList", "remove_item", item_id=item_id)
        text = sim.say(["Remove {r} from the list.", "Delete {r}; it's not needed any more.",
                        "Take {r} off my to-dos."], r=ref)
    sim.show("TodoList", [item_id])
    return text[0].upper() + text[1:]


def _read_items(sim: _Sim) -> str | None:
    items = sim.objects("TodoList")
    include_done = sim.rng.random() < 0.3
    shown = [i for i, v in items.items() if include_done or not v["done"]]
    if not shown:
        return None
    if include_done:
        sim.run("TodoList", "list_items", include_done=True)
        text = sim.say(["Show the whole to-do list, finished items too.", "List all my to-dos, including done ones."])
    else:
        sim.run("TodoList", "list_items")
        text = sim.say(["What's still open on my to-do list?", "Show my open to-dos.", "What do I still have to do?"])
    sim.read = ("list_items", (include_done, len(shown)))
    sim.show("TodoList", shown, listed=True)
    return text


def _add_event(sim: _Sim) -> str | None:
    titles = {e["title"] for e in sim.objects("Calendar").values()}
    title, date, time = sim.rng.choice([t for t in NEW_EVENTS if t not in titles]), sim.date(), sim.rng.choice(TIMES)
    result = sim.run("Calendar", "add_event", title=title, date=date, time=time)
    sim.show("Calendar", [result["event_id"]])
    sim.dated.add(result["event_id"])
    return sim.say(["Add '{t}' on {d} at {h}.", "Put '{t}' in my calendar for {d}, {h}.",
                    "Schedule '{t}' on {d} at {h}, please."], t=title, d=date, h=time)


def _change_event(sim: _Sim) -> str | None:
    events = sim.objects("Calendar")
    picked = sim.target("Calendar", list(events))
    if picked is None:
        return None
    event_id, how = picked
    event = events[event_id]
    ref = {"it": sim.rng.choice(["it", "that event"]), "name": f"the {event['title']}",
           "id": sim.rng.choice([f"event {event_id}", f"the {event['title']} (event {event_id})"])}[how]
    if sim.rng.random() < 0.35 and len(events) > 1:
        sim.run("Calendar", "cancel_event", event_id=event_id)
        sim.show("Calendar", [])
        text = sim.say(["Cancel {r}.", "Drop {r} from my calendar.", "Please call off {r}."], r=ref)
    elif sim.rng.random() < 0.4:
        if event_id not in sim.dated:  # "the same day" needs the day: the user says it
            ref = f"{ref} on {event['date']}"
        time = sim.rng.choice([t for t in TIMES if t != event["time"]])
        sim.run("Calendar", "reschedule_event", event_id=event_id, date=event["date"], time=time)
        sim.show("Calendar", [event_id])
        sim.dated.add(event_id)
        text = sim.say(["Move {r} to {h} the same day.", "Shift {r} to {h}, same date."], r=ref, h=time)
    else:
        date, time = sim.date(), sim.rng.choice(TIMES)
        sim.run("Calendar", "reschedule_event", event_id=event_id, date=date, time=time)
        sim.show("Calendar", [event_id])
        sim.dated.add(event_id)
        text = sim.say(["Move {r} to {d} at {h}.", "Reschedule {r} for {d} at {h}.", "Push {r} to {d}, {h}."],
                       r=ref, d=date, h=time)
    return text[0].upper() + text[1:]


def _read_events(sim: _Sim) -> str | None:
    events = sim.objects("Calendar")
    if not events:
        return None
    date = sim.rng.choice(sorted({e["date"] for e in events.values()}))
    shown = sorted((i for i, e in events.items() if e["date"] == date), key=lambda i: events[i]["time"])
    sim.run("Calendar", "list_events", date=date)
    sim.read = ("list_events", [(events[i]["title"], events[i]["time"]) for i in shown])
    sim.show("Calendar", shown, listed=True)
    sim.dated.update(shown)
    return sim.say(["What's on my calendar on {d}?", "What do I have on {d}?", "Anything planned for {d}?"], d=date)


ACTIONS: dict[str, list[Callable[[_Sim], str | None]]] = {
    "NotesApp": [_create_note, _change_note, _change_note, _read_notes],
    "TodoList": [_add_item, _change_item, _change_item, _read_items],
    "Calendar": [_add_event, _change_event, _change_event, _read_events],
}
READS = {"NotesApp": _read_notes, "TodoList": _read_items, "Calendar": _read_events}


# ----- turns and tasks ----------------------------------------------------------------------------

def _call_turn(sim: _Sim, apps: list[str], multi: bool) -> dict[str, Any] | None:
    """One user turn with calls: one action of ``apps[0]``, or with ``multi`` a second one (of
    ``apps[-1]``) asked in the same message, which names its object by id."""
    sim.calls, sim.read = [], None
    first = sim.rng.choice(ACTIONS[apps[0]])(sim)
    if first is None:
        return None
    if multi:
        sim.show("", [])
        second = sim.rng.choice(ACTIONS[apps[-1]])(sim)
        if second is None:
            return None
        joined = second if second.startswith(("I ", "I'")) else second[0].lower() + second[1:]
        first = f"{first} {sim.rng.choice(['Also,', 'And', 'Then'])} {joined}"
    return {"user": first, "gt": list(sim.calls)}


def _answered(sim: _Sim) -> str | None:
    """A question the previous turn's tool result already answers (no call needed), or None."""
    if sim.read is None:
        return None
    method, shown = sim.read
    if method == "list_notes":
        folder, _ = shown
        return (f"How many notes did you say are in the {folder} folder?" if folder
                else "So how many notes do I have in total?")
    if method == "search_notes":
        return sim.rng.choice(["What's the id of that note again?", "Which note number was that, then?"])
    if method == "read_note":
        return sim.rng.choice(["Which folder is that note in, again?", "Remind me, what's that note's title?"])
    if method == "list_items":
        return "How many items was that in total?" if shown[0] else "So how many are still open?"
    title, _ = sim.rng.choice(shown)
    return sim.rng.choice([f"What time is the {title} again?", "How many things do I have that day, then?"])


ABSTAIN_PATTERNS: tuple[tuple[str, ...], ...] = (
    ("call", "closing"), ("call", "call", "closing"), ("hold", "call"), ("hold", "call", "call"),
    ("call", "hold", "call"), ("call", "cannot"), ("cannot", "call"), ("call", "cannot", "call"),
    ("read", "answered"), ("read", "answered", "call"))


def _abstain_turns(sim: _Sim, apps: list[str]) -> list[dict[str, Any]] | None:
    """Turns of an abstain task: call turns and at least one turn whose right move is no call."""
    turns: list[dict[str, Any]] = []
    for slot in sim.rng.choice(ABSTAIN_PATTERNS):
        app = sim.rng.choice(apps)
        if slot in ("call", "read"):
            turn = _call_turn(sim, [app], multi=False) if slot == "call" else _read_turn(sim, app)
            if turn is None:
                return None
            turns.append(turn)
            continue
        options = {"closing": CLOSINGS, "hold": HOLDS, "cannot": CANNOT}
        text = _answered(sim) if slot == "answered" else sim.rng.choice(options[slot])
        if text is None:
            return None
        turns.append({"user": text, "gt": []})
        sim.show("", [])
        sim.read = None
    return turns


def _read_turn(sim: _Sim, app: str) -> dict[str, Any] | None:
    sim.calls, sim.read = [], None
    text = READS[app](sim)
    return None if text is None else {"user": text, "gt": list(sim.calls)}


def _apps(category: str, rng: random.Random) -> list[str]:
    if category == "single_app":
        return [rng.choice(APPS)]
    if category == "cross_app":
        return rng.sample(APPS, 3 if rng.random() < 0.2 else 2)
    return rng.sample(APPS, 2 if rng.random() < 0.35 else 1)


def _initial_state(sim: _Sim, apps: list[str]) -> dict[str, Any]:
    """A varied starting state of ``apps``: 3-5 notes, to-do items or events each."""
    rng, state = sim.rng, {}
    if "NotesApp" in apps:
        state["NotesApp"] = {"notes": [{"title": t, "body": b, "folder": f,
                                        "tags": [rng.choice(TAGS)] if rng.random() < 0.25 else []}
                                       for t, b, f, _ in rng.sample(NOTES, rng.randint(3, 5))]}
    if "TodoList" in apps:
        items = [{"text": t, "due": sim.date() if rng.random() < 0.6 else None, "done": rng.random() < 0.25}
                 for t in rng.sample(TODOS, rng.randint(3, 5))]
        for item in items[:2]:
            item["done"] = item["done"] and sum(not i["done"] for i in items) >= 2
        state["TodoList"] = {"items": items}
    if "Calendar" in apps:
        dates = sorted({sim.date() for _ in range(3)})
        events: list[dict[str, str]] = []
        for title in rng.sample(EVENTS, rng.randint(3, 5)):
            date = rng.choice(dates)
            taken = {e["time"] for e in events if e["date"] == date}
            events.append({"title": title, "date": date, "time": rng.choice([t for t in TIMES if t not in taken])})
        state["Calendar"] = {"events": events}
    return state


def _draw(number: int, category: str, rng: random.Random) -> dict[str, Any] | None:
    """One candidate task (None: an action found nothing to act on; the caller draws again)."""
    apps = _apps(category, rng)
    sim = _Sim(rng, World([], {}), month=rng.randint(6, 10))
    state = _initial_state(sim, apps)
    sim.world = World(apps, state)
    if category == "abstain":
        turns = _abstain_turns(sim, apps)
    else:
        n = max(len(apps), 3 if rng.random() < 0.3 else 2)
        order = apps + [rng.choice(apps) for _ in range(n - len(apps))]
        rng.shuffle(order)
        turns = []
        for k, app in enumerate(order):
            multi = rng.random() < 0.15
            pair = [app, order[(k + 1) % n] if category == "cross_app" else app]
            turn = _call_turn(sim, pair if multi else [app], multi)
            if turn is None:
                return None
            turns.append(turn)
    calls = [call for turn in turns or [] for call in turn["gt"]]
    if turns is None or len(set(calls)) < len(calls):  # a call asked twice (the same listing) is no task
        return None
    return {"id": f"notes_{number:03d}", "category": category, "split": "test", "classes": apps,
            "initial_state": state, "turns": turns}


def _as_model_turns(gt_turns: list[list[str]]) -> list[list[list[str]]]:
    """Ground-truth calls as an episode's model turns: one step with all of a turn's calls."""
    return [[list(calls)] if calls else [] for calls in gt_turns]


def perturbations(gt_turns: list[list[str]]) -> Iterator[list[list[str]]]:
    """The ground truth with the last call of one turn dropped, or one string argument changed."""
    for k, calls in enumerate(gt_turns):
        if calls:
            yield [*gt_turns[:k], calls[:-1], *gt_turns[k + 1:]]
        for j, call in enumerate(calls):
            parsed = parse_call(call)
            for key, value in parsed.kwargs.items():
                if isinstance(value, str):
                    changed = call_to_string(parsed.name, {**parsed.kwargs, key: value + " x"})
                    yield [*gt_turns[:k], [*calls[:j], changed, *calls[j + 1:]], *gt_turns[k + 1:]]


def sound(record: dict[str, Any]) -> bool:
    """Whether the task's ground truth passes the checker and each of its :func:`perturbations` fails."""
    task = NotesTask.from_record(record)
    gt = [list(calls) for calls in task.gt_turns]
    if not check_episode(_as_model_turns(gt), task)["valid"]:
        return False
    return not any(check_episode(_as_model_turns(p), task)["valid"] for p in perturbations(gt))


def generate() -> list[dict[str, Any]]:
    """The generated test tasks, in id order (the same every time)."""
    order = [category for category, n in COUNTS for _ in range(n)]
    random.Random(SEED).shuffle(order)
    records = []
    for k, category in enumerate(order):
        number, rng = FIRST_ID + k, random.Random(SEED + FIRST_ID + k)
        for _ in range(MAX_DRAWS):
            record = _draw(number, category, rng)
            if record is not None and sound(record):
                records.append(record)
                break
        else:
            raise RuntimeError(f"notes_{number:03d}: no sound {category} task in {MAX_DRAWS} draws")
    return records


def render(records: list[dict[str, Any]]) -> str:
    """The JSON-lines text of ``records`` (the committed file's bytes)."""
    return "".join(json.dumps(record) + "\n" for record in records)


def summary(records: list[dict[str, Any]]) -> str:
    categories = Counter(r["category"] for r in records)
    turns = Counter(len(r["turns"]) for r in records)
    return (f"{len(records)} tasks ({', '.join(f'{c} {categories[c]}' for c, _ in COUNTS)}; "
            f"{', '.join(f'{k} turns: {v}' for k, v in sorted(turns.items()))})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m env_service.notes.generate",
                                 description="Generate the notes test tasks (tasks_test.jsonl) deterministically.")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true",
                      help="exit 1 if the committed file differs from a fresh generation")
    mode.add_argument("--write", action="store_true", help="rewrite the committed file")
    ap.add_argument("--out", type=Path, default=GENERATED_TASKS_FILE,
                    help="the file (default: env_service/notes/tasks_test.jsonl)")
    args = ap.parse_args(argv)
    records = generate()
    text = render(records)
    if args.write:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}: {summary(records)}")
        return 0
    if not args.out.is_file() or args.out.read_text(encoding="utf-8") != text:
        print(f"{args.out} differs from a fresh generation (fix: python -m env_service.notes.generate --write)",
              file=sys.stderr)
        return 1
    print(f"{args.out} is up to date: {summary(records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
