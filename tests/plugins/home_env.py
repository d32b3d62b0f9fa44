"""``home``: an environment written outside the project, plugged in through ``seal.plugins`` only.

Built on the public environment kit (:mod:`env_service.kit`), as ``docs/extending.md`` walks through:
its tools (a smart-home app: rooms with a temperature and a light), its tasks (seven two-turn
tasks), its episode (a fresh home per rollout; the kit's replay is the per-turn check) and one
registration. It honours no interface-evolution block (its params are the kit's plain
``EpisodeParams``). Tests load it with ``seal.plugins: [home_env]`` / ``--plugin home_env``.
"""

from __future__ import annotations

import copy
from typing import Any

from env_service.kit import (
    EpisodeParams, Task, TaskStore, ToolBox, ToolEpisode, ground_truth_replies, register_tool_environment, tool_docs,
)


class Home:
    """A smart home: rooms with a temperature and a light."""

    def __init__(self) -> None:
        self.rooms = {"kitchen": {"temp": 19, "light": False}, "bedroom": {"temp": 21, "light": True}}

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(self.rooms)

    def get_room(self, room: str) -> dict[str, Any]:
        """Read a room's temperature and light.

        Args:
            room: the room's name (kitchen or bedroom).
        """
        return dict(self.rooms[room]) if room in self.rooms else {"error": f"unknown room {room!r}"}

    def set_temperature(self, room: str, degrees: int) -> dict[str, Any]:
        """Set a room's temperature in degrees Celsius.

        Args:
            room: the room's name.
            degrees: the new temperature.
        """
        return self._set(room, "temp", degrees)

    def set_light(self, room: str, on: bool) -> dict[str, Any]:
        """Switch a room's light on or off.

        Args:
            room: the room's name.
            on: true for on, false for off.
        """
        return self._set(room, "light", on)

    def _set(self, room: str, key: str, value: Any) -> dict[str, Any]:
        if room not in self.rooms:
            return {"error": f"unknown room {room!r}"}
        self.rooms[room][key] = value
        return dict(self.rooms[room])


class HomeTask(Task):
    @property
    def users(self) -> list[str]:
        """The user messages (the tests' oracle chat server finds a task by its first)."""
        return list(self.user_turns)


def _task(number: int, category: str, split: str, *turns: tuple[str, list[str]]) -> HomeTask:
    return HomeTask(id=f"home_{number}", category=category, split=split, user_turns=[user for user, _ in turns],
                    gt_turns=[gt for _, gt in turns], tools=tool_docs([Home]))


TASKS = {t.id: t for t in [
    _task(0, "climate", "train", ("Make the kitchen 22 degrees.", ["set_temperature(room='kitchen', degrees=22)"]),
          ("And turn its light on.", ["set_light(room='kitchen', on=True)"])),
    _task(1, "climate", "train", ("Set the bedroom to 18.", ["set_temperature(room='bedroom', degrees=18)"]),
          ("Thanks, that's all.", [])),
    _task(2, "lights", "train", ("Lights off in the bedroom.", ["set_light(room='bedroom', on=False)"]),
          ("Kitchen light on too.", ["set_light(room='kitchen', on=True)"])),
    _task(3, "lights", "train", ("Is the bedroom light on?", ["get_room(room='bedroom')"]),
          ("Switch it off.", ["set_light(room='bedroom', on=False)"])),
    _task(4, "climate", "val", ("Kitchen to 20 degrees please.", ["set_temperature(room='kitchen', degrees=20)"]),
          ("Bedroom to 20 as well.", ["set_temperature(room='bedroom', degrees=20)"])),
    _task(5, "lights", "val", ("Turn on the kitchen light.", ["set_light(room='kitchen', on=True)"]),
          ("No, nothing else.", [])),
    _task(6, "climate", "test", ("How warm is the kitchen?", ["get_room(room='kitchen')"]),
          ("Make it 21.", ["set_temperature(room='kitchen', degrees=21)"])),
]}


class HomeEpisode(ToolEpisode):
    """One rollout: the kit's protocol on a fresh home."""

    params_model = EpisodeParams  # rollout_mode and max_steps_per_turn; no interface-evolution block

    def start(self) -> ToolBox:
        return ToolBox({"home": Home()})


def oracle_replies(task_id: str) -> list[str]:
    """The assistant messages that play a task's ground truth (calls, then a plain reply, per turn)."""
    return ground_truth_replies(TASKS[task_id])


ENVIRONMENT = register_tool_environment("home", episode=HomeEpisode, tasks=TaskStore(TASKS.values(), env="home"),
                                        description="a smart home (tests' plug-in environment)",
                                        example_task_id="home_0")
