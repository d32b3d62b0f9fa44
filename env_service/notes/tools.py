"""The tools of the ``notes`` environment: three small stateful apps, plain Python classes.

Each public method is a tool. Its signature (type hints, defaults) and docstring (first line: what
it does; ``Args:`` lines: ``name: description``) are all the prompt shows, turned into JSON tool
docs by :func:`env_service.kit.tool_docs`. A method reports a failure by returning
``{"error": "..."}``, as BFCL's backends do: the kit's default tool-error rule, so the failure counts
as a tool error and gets the recovery hints. ``state()`` is the public state the checker compares
after every turn.
"""

from __future__ import annotations

import copy
import re
from typing import Any

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIME = re.compile(r"^\d{2}:\d{2}$")


class NotesApp:
    """A note-taking app: notes with a title, a body, a folder and tags."""

    def __init__(self, notes: list[dict[str, Any]] | None = None) -> None:
        self._notes: dict[int, dict[str, Any]] = {}
        self._next_id = 1
        for note in notes or []:
            self._add(note["title"], note.get("body", ""), note.get("folder", "inbox"), note.get("tags", []))

    def _add(self, title: str, body: str, folder: str, tags: list[str]) -> int:
        note_id = self._next_id
        self._next_id += 1
        self._notes[note_id] = {"title": title, "body": body, "folder": folder, "tags": sorted(set(tags))}
        return note_id

    def state(self) -> dict[str, Any]:
        return {"notes": copy.deepcopy(self._notes)}

    def create_note(self, title: str, body: str, folder: str = "inbox") -> dict[str, Any]:
        """Create a note and return its id.

        Args:
            title: the note's title.
            body: the note's text.
            folder: the folder to file it in.
        """
        if not title.strip():
            return {"error": "title must not be empty"}
        return {"note_id": self._add(title, body, folder, [])}

    def list_notes(self, folder: str | None = None) -> dict[str, Any]:
        """List the notes (id, title, folder), optionally of one folder only.

        Args:
            folder: only the notes of this folder.
        """
        return {"notes": [{"note_id": i, "title": n["title"], "folder": n["folder"]}
                          for i, n in self._notes.items() if folder is None or n["folder"] == folder]}

    def read_note(self, note_id: int) -> dict[str, Any]:
        """Read one note: title, body, folder and tags.

        Args:
            note_id: the note's id.
        """
        if note_id not in self._notes:
            return {"error": f"no note with id {note_id}"}
        return {"note_id": note_id, **copy.deepcopy(self._notes[note_id])}

    def search_notes(self, query: str) -> dict[str, Any]:
        """Find the notes whose title or body contains the text (case-insensitive).

        Args:
            query: the text to look for.
        """
        q = query.lower()
        return {"note_ids": [i for i, n in self._notes.items() if q in n["title"].lower() or q in n["body"].lower()]}

    def append_to_note(self, note_id: int, text: str) -> dict[str, Any]:
        """Add a line of text at the end of a note's body.

        Args:
            note_id: the note's id.
            text: the line to add.
        """
        if note_id not in self._notes:
            return {"error": f"no note with id {note_id}"}
        body = self._notes[note_id]["body"]
        self._notes[note_id]["body"] = f"{body}\n{text}" if body else text
        return {"note_id": note_id, "body": self._notes[note_id]["body"]}

    def move_note(self, note_id: int, folder: str) -> dict[str, Any]:
        """Move a note to another folder.

        Args:
            note_id: the note's id.
            folder: the destination folder.
        """
        if note_id not in self._notes:
            return {"error": f"no note with id {note_id}"}
        self._notes[note_id]["folder"] = folder
        return {"note_id": note_id, "folder": folder}

    def tag_note(self, note_id: int, tag: str) -> dict[str, Any]:
        """Add a tag to a note.

        Args:
            note_id: the note's id.
            tag: the tag to add.
        """
        if note_id not in self._notes:
            return {"error": f"no note with id {note_id}"}
        self._notes[note_id]["tags"] = sorted(set(self._notes[note_id]["tags"]) | {tag})
        return {"note_id": note_id, "tags": self._notes[note_id]["tags"]}

    def delete_note(self, note_id: int) -> dict[str, Any]:
        """Delete a note.

        Args:
            note_id: the note's id.
        """
        if self._notes.pop(note_id, None) is None:
            return {"error": f"no note with id {note_id}"}
        return {"deleted": note_id}


class TodoList:
    """A to-do list: tasks with a text, an optional due date and a done flag."""

    def __init__(self, items: list[dict[str, Any]] | None = None) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._next_id = 1
        for item in items or []:
            item_id = self._next_id
            self._next_id += 1
            self._items[item_id] = {"text": item["text"], "due": item.get("due"), "done": bool(item.get("done"))}

    def state(self) -> dict[str, Any]:
        return {"items": copy.deepcopy(self._items)}

    def add_item(self, text: str, due: str | None = None) -> dict[str, Any]:
        """Add an item to the to-do list and return its id.

        Args:
            text: what has to be done.
            due: the due date, YYYY-MM-DD.
        """
        if due is not None and not _DATE.match(due):
            return {"error": f"due must be a date YYYY-MM-DD, got {due!r}"}
        item_id = self._next_id
        self._next_id += 1
        self._items[item_id] = {"text": text, "due": due, "done": False}
        return {"item_id": item_id}

    def list_items(self, include_done: bool = False) -> dict[str, Any]:
        """List the open items (and the finished ones too if asked).

        Args:
            include_done: also list the items marked done.
        """
        return {"items": [{"item_id": i, **v} for i, v in self._items.items() if include_done or not v["done"]]}

    def complete_item(self, item_id: int) -> dict[str, Any]:
        """Mark an item as done.

        Args:
            item_id: the item's id.
        """
        if item_id not in self._items:
            return {"error": f"no to-do item with id {item_id}"}
        self._items[item_id]["done"] = True
        return {"item_id": item_id, "done": True}

    def remove_item(self, item_id: int) -> dict[str, Any]:
        """Remove an item from the list.

        Args:
            item_id: the item's id.
        """
        if self._items.pop(item_id, None) is None:
            return {"error": f"no to-do item with id {item_id}"}
        return {"removed": item_id}


class Calendar:
    """A calendar: events with a title, a date and a start time."""

    def __init__(self, events: list[dict[str, Any]] | None = None) -> None:
        self._events: dict[int, dict[str, Any]] = {}
        self._next_id = 1
        for event in events or []:
            self._put(event["title"], event["date"], event["time"])

    def _put(self, title: str, date: str, time: str) -> int:
        event_id = self._next_id
        self._next_id += 1
        self._events[event_id] = {"title": title, "date": date, "time": time}
        return event_id

    def state(self) -> dict[str, Any]:
        return {"events": copy.deepcopy(self._events)}

    def add_event(self, title: str, date: str, time: str) -> dict[str, Any]:
        """Put an event in the calendar and return its id.

        Args:
            title: the event's title.
            date: the day, YYYY-MM-DD.
            time: the start time, HH:MM (24 h).
        """
        if not _DATE.match(date) or not _TIME.match(time):
            return {"error": f"date must be YYYY-MM-DD and time HH:MM, got {date!r} {time!r}"}
        return {"event_id": self._put(title, date, time)}

    def list_events(self, date: str) -> dict[str, Any]:
        """List the events of one day, earliest first.

        Args:
            date: the day, YYYY-MM-DD.
        """
        day = [{"event_id": i, **e} for i, e in self._events.items() if e["date"] == date]
        return {"events": sorted(day, key=lambda e: e["time"])}

    def reschedule_event(self, event_id: int, date: str, time: str) -> dict[str, Any]:
        """Move an event to another day and time.

        Args:
            event_id: the event's id.
            date: the new day, YYYY-MM-DD.
            time: the new start time, HH:MM (24 h).
        """
        if event_id not in self._events:
            return {"error": f"no event with id {event_id}"}
        if not _DATE.match(date) or not _TIME.match(time):
            return {"error": f"date must be YYYY-MM-DD and time HH:MM, got {date!r} {time!r}"}
        self._events[event_id].update(date=date, time=time)
        return {"event_id": event_id, **self._events[event_id]}

    def cancel_event(self, event_id: int) -> dict[str, Any]:
        """Remove an event from the calendar.

        Args:
            event_id: the event's id.
        """
        if self._events.pop(event_id, None) is None:
            return {"error": f"no event with id {event_id}"}
        return {"cancelled": event_id}


TOOL_CLASSES: dict[str, type] = {cls.__name__: cls for cls in (NotesApp, TodoList, Calendar)}
