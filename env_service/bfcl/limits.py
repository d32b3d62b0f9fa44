"""What keeps one BFCL tool call cheap: its time budget and the bounds on its arguments.

* :func:`time_budget` interrupts Python-level work after the budget on *any* thread: on the main
  thread with ``SIGALRM`` (``setitimer``), elsewhere (the in-process service runs episodes on its
  event-loop thread) with a watchdog thread that raises :class:`CallTimeout` in the calling thread
  through ``PyThreadState_SetAsyncExc``. Neither can stop a single long C-level operation, so
* :func:`argument_problem` refuses, before the call, the arguments that make BFCL's own functions
  spend seconds to minutes inside C code (``decimal``, big-integer and ``mpmath`` arithmetic in
  ``MathAPI``). The bounds sit far above anything BFCL's tasks use (their precisions are single
  digits) and keep each call well under 0.2 s on one core.

The caps on tool results and observations, and the time budget of one message's calls, are the
kit's (:mod:`env_service.kit.episode`).
"""

from __future__ import annotations

import ctypes
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MAX_PRECISION = 10_000  # decimal / mpmath digits: sqrt 0.07 s, log 0.17 s at this bound
MAX_RESULT_BITS = 1_000_000  # an integer power's size (about 300,000 decimal digits, ~0.02 s)
MAX_ROUND_DIGITS = 10_000  # round(int, -n) computes 10**n
_WATCHDOG_PERIOD_S = 0.05


class CallTimeout(BaseException):
    """Raised when a call's budget expires. A ``BaseException`` so backend ``except Exception`` cannot swallow it."""


# --------------------------------------------------------------------------- argument bounds


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _precision(args: dict[str, Any]) -> str | None:
    precision = args.get("precision")
    if _is_int(precision) and precision > MAX_PRECISION:
        return f"precision {precision} is above this environment's limit of {MAX_PRECISION} digits"
    return None


def _power(args: dict[str, Any]) -> str | None:
    base, exponent = args.get("base"), args.get("exponent")
    if _is_int(base) and _is_int(exponent) and exponent > 0 and abs(base) > 1:
        bits = exponent * math.log2(abs(base))
        if bits > MAX_RESULT_BITS:
            return (f"the result of {base}**{exponent} would have about {int(bits):,} bits; "
                    f"this environment's limit is {MAX_RESULT_BITS:,}")
    return None


def _round(args: dict[str, Any]) -> str | None:
    number, places = args.get("number"), args.get("decimal_places")
    if _is_int(number) and _is_int(places) and places < -MAX_ROUND_DIGITS:
        return f"decimal_places {places} is below this environment's limit of -{MAX_ROUND_DIGITS}"
    return None


_ARGUMENT_CHECKS: dict[tuple[str, str], Callable[[dict[str, Any]], str | None]] = {
    ("MathAPI", "square_root"): _precision, ("MathAPI", "logarithm"): _precision, ("MathAPI", "power"): _power,
    ("MathAPI", "round_number"): _round}


def argument_problem(class_name: str, method_name: str, arguments: dict[str, Any]) -> str | None:
    """Why this call would run unbounded C code (one line), or ``None``. ``arguments`` are bound by name."""
    check = _ARGUMENT_CHECKS.get((class_name, method_name))
    return check(arguments) if check is not None else None


def has_argument_checks(class_name: str, method_name: str) -> bool:
    return (class_name, method_name) in _ARGUMENT_CHECKS


# --------------------------------------------------------------------------- time budget


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = [ctypes.c_ulong, ctypes.py_object]
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


class _Watchdog:
    """One daemon thread per process that interrupts calls past their deadline on non-main threads.

    It polls every 50 ms instead of being woken per call: arming and disarming are then two dict
    operations under a lock, which keeps the budget nearly free on the hot path.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple[float, int]] = {}  # token -> (deadline, thread id)
        self._fired: set[int] = set()
        self._next = 0
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="env-call-watchdog", daemon=True)
                self._thread.start()
            self._next += 1
            self._armed[self._next] = (time.monotonic() + seconds, threading.get_ident())
            return self._next

    def disarm(self, token: int) -> None:
        with self._lock:
            self._armed.pop(token, None)
            fired = token in self._fired
            self._fired.discard(token)
        if fired:
            # The interrupt was sent but the call finished first: drop it before it lands elsewhere.
            _clear_async_exc(threading.get_ident(), None)

    def _run(self) -> None:
        while True:
            time.sleep(_WATCHDOG_PERIOD_S)
            now = time.monotonic()
            with self._lock:
                for token, (deadline, thread_id) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[token]
                        self._fired.add(token)
                        _set_async_exc(thread_id, CallTimeout)


_WATCHDOG = _Watchdog()


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Raise :class:`CallTimeout` in this thread if the block runs longer than ``seconds`` (0: no budget)."""
    if seconds <= 0:
        yield
        return
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def _expire(signum: int, frame: Any) -> None:
            raise CallTimeout()

        previous = signal.signal(signal.SIGALRM, _expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return
    token = _WATCHDOG.arm(seconds)
    try:
        yield
    finally:
        _WATCHDOG.disarm(token)
