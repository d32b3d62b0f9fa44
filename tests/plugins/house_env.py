"""``house``: a second environment for the learning benchmark, written on the public kit only.

A smart house (five rooms, each with a temperature, a light and blinds) behind five tools, and 120
generated tasks of two or three user turns (90 train, 30 val; ``docs/benchmarks.md#learning``). It
is ``home_env``'s world grown to a benchmark: varied phrasings, a task's own starting state, turns
that need a reading before the change (``query``), two calls in one turn (``multi``) and turns
whose right move is no call. Interface evolution applies (the kit's ``InterfaceParams``), so the
SEAL recipe and its vanilla ablation run on it unchanged. Load it with ``seal.plugins:
[house_env]`` and this folder on ``PYTHONPATH`` (``tests/plugins/house_learning.yaml``).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

from env_service.kit import Task, TaskStore, ToolBox, ToolEpisode, register_tool_environment, tool_docs

ROOMS = ("living_room", "kitchen", "bedroom", "bathroom", "office")
N_TASKS, VAL_EVERY = 120, 4  # every 4th task is held out: 90 train, 30 val
SEED = 20261127


class House:
    """A smart house: rooms with a temperature, a light and blinds."""

    def __init__(self, rooms: dict[str, dict[str, Any]]) -> None:
        self._rooms = copy.deepcopy(rooms)

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(self._rooms)

    def list_rooms(self) -> dict[str, Any]:
        """List the rooms of the house."""
        return {"rooms": sorted(self._rooms)}

    def get_room(self, room: str) -> dict[str, Any]:
        """Read a room's temperature (degrees Celsius), light and blinds (percent open).

        Args:
            room: the room's name, e.g. living_room or kitchen.
        """
        if room not in self._rooms:
            return {"error": f"unknown room {room!r}; rooms: {', '.join(sorted(self._rooms))}"}
        return {"room": room, **self._rooms[room]}

    def set_temperature(self, room: str, degrees: int) -> dict[str, Any]:
        """Set a room's thermostat.

        Args:
            room: the room's name.
            degrees: the new temperature in degrees Celsius, 10 to 30.
        """
        if not 10 <= degrees <= 30:
            return {"error": f"degrees must be between 10 and 30, got {degrees}"}
        return self._set(room, "temperature", degrees)

    def set_light(self, room: str, on: bool) -> dict[str, Any]:
        """Switch a room's light on or off.

        Args:
            room: the room's name.
            on: true for on, false for off.
        """
        return self._set(room, "light", on)

    def set_blinds(self, room: str, percent: int) -> dict[str, Any]:
        """Open a room's blinds to a percentage (0 closed, 100 fully open).

        Args:
            room: the room's name.
            percent: how far open, 0 to 100.
        """
        if not 0 <= percent <= 100:
            return {"error": f"percent must be between 0 and 100, got {percent}"}
        return self._set(room, "blinds", percent)

    def _set(self, room: str, key: str, value: Any) -> dict[str, Any]:
        if room not in self._rooms:
            return {"error": f"unknown room {room!r}; rooms: {', '.join(sorted(self._rooms))}"}
        self._rooms[room][key] = value
        return {"room": room, **self._rooms[room]}


@dataclass(frozen=True, kw_only=True)
class HouseTask(Task):
    """A kit task plus the house's starting state."""

    rooms: dict[str, dict[str, Any]] = field(default_factory=dict)


class HouseEpisode(ToolEpisode):
    """One rollout: the kit's protocol on the task's house."""

    task: HouseTask

    def start(self) -> ToolBox:
        return ToolBox({"house": House(self.task.rooms)})


# -- task generation: (user message, ground-truth calls) per turn, from a seeded generator -------------

def _say(room: str) -> str:
    return room.replace("_", " ")


def _temperature(rng: random.Random, room: str, rooms: dict) -> tuple[str, list[str]]:
    degrees = rng.choice([t for t in range(17, 25) if t != rooms[room]["temperature"]])
    text = rng.choice(["Set the {r} to {t} degrees.", "Please make the {r} {t} degrees.",
                       "I'd like the {r} at {t} degrees Celsius.", "Change the {r} thermostat to {t}."])
    return text.format(r=_say(room), t=degrees), [f"set_temperature(room='{room}', degrees={degrees})"]


def _light(rng: random.Random, room: str, rooms: dict) -> tuple[str, list[str]]:
    on = not rooms[room]["light"]
    word = "on" if on else "off"
    text = rng.choice(["Turn the {r} light {w}.", "Switch {w} the light in the {r}.",
                       "Lights {w} in the {r}, please.", "Can you turn {w} the {r} light?"])
    return text.format(r=_say(room), w=word), [f"set_light(room='{room}', on={on})"]


def _blinds(rng: random.Random, room: str, rooms: dict) -> tuple[str, list[str]]:
    percent, text = rng.choice([(100, "Open the {r} blinds fully."), (0, "Close the blinds in the {r}."),
                                (50, "Open the {r} blinds halfway."), (25, "Set the {r} blinds to 25 percent."),
                                (75, "Open the blinds in the {r} to 75 percent.")])
    return text.format(r=_say(room)), [f"set_blinds(room='{room}', percent={percent})"]


def _query_then_relative(rng: random.Random, room: str, rooms: dict) -> list[tuple[str, list[str]]]:
    delta = rng.choice([-3, -2, -1, 1, 2, 3])
    ask = rng.choice(["How warm is the {r} right now?", "What temperature is the {r} at?",
                      "Check the {r} for me: how warm is it?"]).format(r=_say(room))
    change = (f"Make it {abs(delta)} degree{'s' if abs(delta) > 1 else ''} "
              f"{'warmer' if delta > 0 else 'cooler'}.")
    target = rooms[room]["temperature"] + delta
    return [(ask, [f"get_room(room='{room}')"]), (change, [f"set_temperature(room='{room}', degrees={target})"])]


def _two_lights(rng: random.Random, room: str, rooms: dict) -> tuple[str, list[str]]:
    other = rng.choice([r for r in ROOMS if r != room])
    on = rng.random() < 0.5
    word = "on" if on else "off"
    text = rng.choice(["Turn {w} the lights in the {a} and the {b}.", "Lights {w} in the {a} and the {b}."])
    return (text.format(w=word, a=_say(room), b=_say(other)),
            [f"set_light(room='{room}', on={on})", f"set_light(room='{other}', on={on})"])


_SINGLE = {"climate": _temperature, "lights": _light, "blinds": _blinds, "multi": _two_lights}
_FOLLOW_UPS = (_temperature, _light, _blinds)
_CLOSINGS = ("Thanks, that's all.", "Great, nothing else for now.", "Perfect, thank you!")


def _starting_rooms(rng: random.Random) -> dict[str, dict[str, Any]]:
    return {room: {"temperature": rng.randint(17, 24), "light": rng.random() < 0.5,
                   "blinds": rng.choice([0, 50, 100])} for room in ROOMS}


def _task(number: int, rng: random.Random) -> HouseTask:
    rooms = _starting_rooms(rng)
    room = rng.choice(ROOMS)
    category = rng.choice(["climate", "lights", "blinds", "multi", "query"])
    if category == "query":
        turns = _query_then_relative(rng, room, rooms)
    else:
        first = _SINGLE[category](rng, room, rooms)
        follow = rng.choice(_FOLLOW_UPS)(rng, rng.choice([room, *ROOMS]), rooms)
        turns = [first, follow]
    if rng.random() < 0.5:
        turns.append((rng.choice(_CLOSINGS), []))
    split = "val" if number % VAL_EVERY == VAL_EVERY - 1 else "train"
    return HouseTask(id=f"house_{number:03d}", category=category, split=split, rooms=rooms,
                     user_turns=[user for user, _ in turns], gt_turns=[gt for _, gt in turns],
                     tools=tool_docs([House]))


def build_tasks(n: int = N_TASKS, seed: int = SEED) -> list[HouseTask]:
    """The benchmark's tasks, the same on every machine (one seeded generator)."""
    rng = random.Random(seed)
    return [_task(k, rng) for k in range(n)]


ENVIRONMENT = register_tool_environment(
    "house", episode=HouseEpisode, tasks=TaskStore(build_tasks(), env="house"), example_task_id="house_000",
    description="a smart house: 120 generated multi-turn tasks (the learning benchmark's second environment)")
