"""Where episodes live: inline in the service process, or in N worker processes.

The BFCL work (parsing, executing tool calls, checking) is CPU-bound Python, so one process holds the
GIL for all of it. :class:`WorkerPool` starts N worker processes (default: one per CPU); each loads the
task store once and owns a set of episodes (instance affinity: an instance lives and dies in the worker
that created it). The service process talks to each worker over a Unix socket pair with
length-prefixed pickle frames; its side is asyncio streams, so the event loop never blocks on a worker
and many requests can be in flight at once (each worker answers its requests in arrival order).

A worker that exits (crash, OOM kill) is noticed at once (end of stream): its pending requests fail
with ``unavailable``, the service is told which generation of the slot died so that the slot's
instances answer a clear error, and a replacement is started. A worker that does not answer within
``request_timeout_s`` is killed and handled the same way, so no request ever hangs.

:class:`InlineBackend` is the same interface without processes (``workers=0``).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import pickle
import signal
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from env_service.host import EpisodeHost, OpError, load_host_factory

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!I")
LostCallback = Callable[[int, int, str], None]  # (slot, dead generation, reason)


class InlineBackend:
    """Episodes in the calling process: one slot, never lost."""

    def __init__(self, host_factory: str | Callable[[], EpisodeHost]) -> None:
        self._factory = load_host_factory(host_factory) if isinstance(host_factory, str) else host_factory
        self._host: EpisodeHost | None = None
        self.size = 1
        self.restarts = 0

    async def start(self) -> None:
        self._host = self._factory()

    async def stop(self) -> None:
        self._host = None

    def alive(self, slot: int) -> bool:
        return self._host is not None

    def generation(self, slot: int) -> int:
        return 0

    async def call(self, slot: int, op: str, instance_id: str, payload: dict) -> Any:
        if self._host is None:
            raise OpError("unavailable", "the environment service is not running")
        return self._host.handle(op, instance_id, payload)


# --------------------------------------------------------------------------- worker process side


def _read_frame(stream: Any) -> Any | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def _frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def worker_main(sock: socket.socket, host_factory: str, log_level: int) -> None:
    """Entry point of a worker process: build the host, then answer frames until the socket closes."""
    # Ctrl-C reaches the whole process group; the service shuts workers down by closing their socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s worker[%(process)d] %(name)s: %(message)s")
    host = load_host_factory(host_factory)()
    stream = sock.makefile("rb", buffering=1 << 16)
    sock.sendall(_frame(("ready", os.getpid())))
    while True:
        request = _read_frame(stream)
        if request is None:
            return  # the service closed our socket: shut down quietly
        req_id, op, instance_id, payload = request
        try:
            reply = _frame((req_id, True, host.handle(op, instance_id, payload)))
        except OpError as err:
            reply = _frame((req_id, False, (err.code, err.message)))
        except Exception as err:  # the answer itself would not pickle (e.g. nested too deeply)
            logger.exception("the answer to %s on instance %s cannot be sent", op, instance_id)
            reply = _frame((req_id, False, ("internal", f"{op}: the answer cannot be sent: {type(err).__name__}")))
        sock.sendall(reply)


# --------------------------------------------------------------------------- service process side


@dataclass(eq=False)
class _Worker:
    """One worker process as seen from the service: its stream and its pending requests."""

    slot: int
    generation: int
    process: Any
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pending: dict[int, asyncio.Future] = field(default_factory=dict)
    alive: bool = True
    reader_task: asyncio.Task | None = None


class WorkerPool:
    """N worker processes with instance affinity (see the module docstring)."""

    def __init__(self, workers: int, host_factory: str, *, request_timeout_s: float = 120.0,
                 start_timeout_s: float = 120.0, on_lost: LostCallback | None = None,
                 preload: Sequence[str] = ()) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1 for a WorkerPool (use InlineBackend for 0), got {workers}")
        load_host_factory(host_factory)  # fail fast on a bad path, in the service process
        self.size = workers
        self.restarts = 0
        self._host_factory = host_factory
        self._request_timeout_s = request_timeout_s
        self._start_timeout_s = start_timeout_s
        self._on_lost = on_lost
        # Never fork the service process itself (it runs an event loop and threads): workers come from
        # a fork server, a clean process that has imported the environment code once, so starting or
        # restarting a worker costs a fork instead of a fresh interpreter.
        self._ctx = mp.get_context("forkserver")
        # ``preload``: plug-in modules (research failure tags) every worker must have registered.
        self._ctx.set_forkserver_preload(["env_service.host", "env_service.pool", host_factory.partition(":")[0],
                                          *preload])
        self._workers: list[_Worker | None] = [None] * workers
        self._generations = [0] * workers
        self._next_id = 0
        self._stopping = False
        self._respawns: set[asyncio.Task] = set()

    async def start(self) -> None:
        t0 = time.perf_counter()
        await asyncio.gather(*(self._spawn(slot) for slot in range(self.size)))
        logger.info("%d environment workers ready in %.1f s (pids %s)", self.size, time.perf_counter() - t0, self.pids())

    async def _spawn(self, slot: int) -> None:
        parent_sock, child_sock = socket.socketpair()
        process = self._ctx.Process(target=worker_main, name=f"env-worker-{slot}", daemon=True,
                                    args=(child_sock, self._host_factory, logging.getLogger().level or logging.WARNING))
        process.start()
        child_sock.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent_sock, limit=1 << 24)
        try:
            hello = await asyncio.wait_for(self._read(reader), self._start_timeout_s)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as err:
            process.kill()
            writer.close()
            raise RuntimeError(f"environment worker {slot} failed to start ({type(err).__name__}); "
                               f"exit code {process.exitcode}; see its log above") from None
        if hello != ("ready", process.pid):
            process.kill()
            writer.close()
            raise RuntimeError(f"environment worker {slot} sent an unexpected greeting {hello!r}")
        worker = _Worker(slot, self._generations[slot], process, reader, writer)
        worker.reader_task = asyncio.create_task(self._read_loop(worker), name=f"env-worker-{slot}-reader")
        self._workers[slot] = worker

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> Any:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        return pickle.loads(await reader.readexactly(size))

    async def _read_loop(self, worker: _Worker) -> None:
        try:
            while True:
                req_id, ok, value = await self._read(worker.reader)
                future = worker.pending.pop(req_id, None)
                if future is None or future.done():
                    continue  # the caller timed out already
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(OpError(*value))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return
        self._mark_lost(worker, "exited")

    def _mark_lost(self, worker: _Worker, what: str) -> None:
        if not worker.alive:
            return
        worker.alive = False
        worker.process.join(timeout=1.0)
        reason = f"environment worker {worker.slot} (pid {worker.process.pid}) {what} (exit code {worker.process.exitcode})"
        if not self._stopping:
            logger.error("%s; its episodes are lost", reason)
        for future in worker.pending.values():
            if not future.done():
                future.set_exception(OpError("unavailable", f"{reason}; the episode is lost, start a new one"))
        worker.pending.clear()
        worker.writer.close()
        self._generations[worker.slot] += 1
        if self._workers[worker.slot] is worker:
            self._workers[worker.slot] = None
        if self._stopping:
            return
        if self._on_lost is not None:
            self._on_lost(worker.slot, worker.generation, reason)
        task = asyncio.get_running_loop().create_task(self._respawn(worker.slot))
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _respawn(self, slot: int) -> None:
        try:
            await self._spawn(slot)
            self.restarts += 1
            logger.warning("environment worker %d restarted", slot)
        except RuntimeError:
            logger.exception("could not restart environment worker %d; the slot stays down", slot)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._respawns):
            task.cancel()
        live = [w for w in self._workers if w is not None]
        for worker in live:
            worker.writer.close()  # the worker sees end of stream and exits
        for worker in live:
            await asyncio.to_thread(worker.process.join, 5.0)
            if worker.process.is_alive():
                worker.process.kill()
            if worker.reader_task is not None:
                worker.reader_task.cancel()
            self._mark_lost(worker, "stopped")

    def alive(self, slot: int) -> bool:
        worker = self._workers[slot]
        return worker is not None and worker.alive

    def generation(self, slot: int) -> int:
        return self._generations[slot]

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w is not None and w.alive]

    async def call(self, slot: int, op: str, instance_id: str, payload: dict) -> Any:
        worker = self._workers[slot]
        if worker is None or not worker.alive:
            raise OpError("unavailable", f"environment worker {slot} is down (restarting); retry the episode")
        self._next_id += 1
        req_id = self._next_id
        try:
            frame = _frame((req_id, op, instance_id, payload))  # before the future: a failure leaves nothing pending
        except (RecursionError, pickle.PicklingError) as err:
            raise OpError("too_large", f"{op}: the request cannot be forwarded to a worker ({type(err).__name__}); "
                                       "send flatter params") from None
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        worker.pending[req_id] = future
        worker.writer.write(frame)
        try:
            return await asyncio.wait_for(future, self._request_timeout_s)
        except asyncio.TimeoutError:
            worker.pending.pop(req_id, None)
            # A worker that does not answer holds every episode it owns hostage: replace it.
            worker.process.kill()
            self._mark_lost(worker, f"did not answer {op} within {self._request_timeout_s:g} s and was killed")
            raise OpError("unavailable", f"environment worker {slot} timed out on {op}; the episode is lost") from None
