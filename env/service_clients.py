"""The clients of the environment service: what each one queued, how much it may queue, and
cancelling all of it once the client is gone.

Why the service keeps its own queue in front of the pool: the pool runs batches in submission
order, and its ``submit`` holds a thread until every item found room (``max_pending``). A
client that sent 3,000 items would hold the pool for all of them, and a client that left could
not take back what was still waiting for room. Here each client (an HTTP request, a
``ServiceClient`` by its id) has its items in its own queue and at most ``client_pool_share`` of
them in the pool at once; the next ones go in as these resolve, so the pool's queue interleaves
the clients. Dropping a client (its HTTP connection closed, its lease ran out, it said goodbye)
cancels everything it has: items still here are answered at once without running, items queued
in the pool leave its queue, and the answer of one a worker already runs is dropped.

Everything here runs on the service actor's event loop; the pool's futures resolve on its own
thread and hop over with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

from kernelrl.env.pools.base import settle
from kernelrl.env.task import Task

#: (tasks, solutions, timeout_s) -> one pool future per item; blocking (runs in a thread).
PoolSubmit = Callable[[list[Task], list[str], float | None], list[Future]]


@dataclass(frozen=True)
class ClientLimits:
    """What one client may ask of the service (recipe keys of ``kernelrl env serve``)."""

    max_items_per_request: int = 512  # an HTTP request, or one ServiceClient submit
    max_client_pending: int = 1024  # unresolved items of one client; more waits
    client_pool_share: int = 128  # of those, in the pool's queue or running at once
    client_lease_s: float = 30.0  # a ServiceClient silent this long is gone

    def __post_init__(self) -> None:
        for name in ("max_items_per_request", "max_client_pending", "client_pool_share"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.client_lease_s <= 0:
            raise ValueError("client_lease_s must be positive")
        if self.max_items_per_request > self.max_client_pending:
            raise ValueError(
                f"max_items_per_request ({self.max_items_per_request}) must not exceed"
                f" max_client_pending ({self.max_client_pending}): one request could never fit"
            )


class ClientGone(RuntimeError):
    """The answer to an item whose client the service dropped (the client left)."""


@dataclass(eq=False)
class _Item:
    task: Task
    solution: str
    deadline: float | None  # monotonic; the client's, counted from its submit
    answer: Future  # what the client waits on
    inner: Future | None = None  # the pool's, once admitted


@dataclass(eq=False)
class _Client:
    key: str
    leased: bool  # a Ray client renewing a lease (an HTTP request is dropped by its handler)
    last_seen: float = 0.0  # on the service's lease clock (Clients.clock)
    waiting: collections.deque[_Item] = field(default_factory=collections.deque)
    live: set[_Item] = field(default_factory=set)  # unresolved items, wherever they are
    in_pool: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    feeder: asyncio.Task | None = None


class Clients:
    def __init__(self, submit: PoolSubmit, limits: ClientLimits, executor: Executor) -> None:
        """``submit``: how items enter the pool, run in ``executor`` (it may block on the
        pool's own backpressure)."""
        self._submit = submit
        self.limits = limits
        self._executor = executor
        self._clients: dict[str, _Client] = {}
        self.clock = 0.0  # seconds the service was there to hear from its clients
        self.dropped = 0  # clients dropped with work left
        self.items_dropped = 0  # their items answered without an evaluation

    # ------------------------------------------------------------------ clients
    async def submit(
        self,
        key: str,
        tasks: Sequence[Task],
        solutions: Sequence[str],
        timeout_s: float | None,
        leased: bool,
    ) -> list[Future]:
        """Queue a batch for client ``key``; one future per item. Waits while the client has
        ``max_client_pending`` unresolved items (backpressure to that client alone)."""
        if len(tasks) > self.limits.max_items_per_request:
            raise ValueError(
                f"{len(tasks)} items in one request; the limit is"
                f" {self.limits.max_items_per_request}"
            )
        client = self._clients.get(key) or self._clients.setdefault(key, _Client(key, leased))
        client.last_seen = self.clock
        limit = self.limits.max_client_pending
        while client.live and len(client.live) + len(tasks) > limit:
            client.changed.clear()
            await client.changed.wait()
            if self._clients.get(key) is not client:  # dropped meanwhile
                raise ClientGone(f"client {key} was dropped while its batch waited")
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        items = [
            _Item(task, solution, deadline, Future())
            for task, solution in zip(tasks, solutions, strict=True)
        ]
        loop = asyncio.get_running_loop()
        for item in items:
            client.live.add(item)
            item.answer.add_done_callback(
                lambda done, c=client, i=item: _on_loop(loop, self._answered, c, i)
            )
            client.waiting.append(item)
        if client.feeder is None:
            client.feeder = loop.create_task(self._feed(client))
        return [item.answer for item in items]

    def touch(self, key: str) -> bool:
        """A lease renewed; False when the service does not know the client (any more)."""
        client = self._clients.get(key)
        if client is not None:
            client.last_seen = self.clock
        return client is not None

    def drop(self, key: str, why: str) -> int:
        """Cancel everything of client ``key``; how many of its items were unresolved."""
        client = self._clients.pop(key, None)
        if client is None:
            return 0
        left = len(client.live)
        if left:
            self.dropped += 1
            self.items_dropped += left
        client.waiting.clear()
        for item in list(client.live):  # each answer's callback takes its item out of the pool
            settle(item.answer, error=ClientGone(why))
        client.changed.set()  # its feeder finds nothing left; a submit waiting for room gives up
        return left

    def tick(self, elapsed_s: float, interval_s: float) -> list[str]:
        """Advance the lease clock by ``elapsed_s`` since the last tick, but by two intervals at
        most: while the service's loop was too busy to tick, it was too busy to read the
        heartbeats queued for it too, and that time is nobody's silence. The leased clients
        silent for ``client_lease_s`` on that clock."""
        self.clock += min(elapsed_s, 2 * interval_s)
        cutoff = self.clock - self.limits.client_lease_s
        return [c.key for c in self._clients.values() if c.leased and c.last_seen < cutoff]

    def stats(self) -> dict[str, int]:
        clients = self._clients.values()
        return {
            "clients": len(self._clients),
            "clients_dropped": self.dropped,
            "client_items_dropped": self.items_dropped,
            "service_queued": sum(1 for c in clients for i in c.waiting if not i.answer.done()),
            "service_unresolved": sum(len(c.live) for c in clients),
        }

    # ------------------------------------------------------------------ items
    async def _feed(self, client: _Client) -> None:
        """Move the client's items into the pool, ``client_pool_share`` at most at once."""
        loop = asyncio.get_running_loop()
        try:
            while client.waiting:
                room = self.limits.client_pool_share - client.in_pool
                if room <= 0:
                    client.changed.clear()
                    await client.changed.wait()
                    continue
                chunk = _take(client.waiting, room)
                if not chunk:
                    continue
                deadline = chunk[0].deadline
                timeout_s = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
                tasks = [item.task for item in chunk]
                solutions = [item.solution for item in chunk]
                client.in_pool += len(chunk)
                try:
                    inner = await loop.run_in_executor(
                        self._executor, self._submit, tasks, solutions, timeout_s
                    )
                except Exception as exc:  # the pool is closing, or refused the batch
                    client.in_pool -= len(chunk)
                    for item in chunk:
                        settle(item.answer, error=exc)
                    continue
                for item, future in zip(chunk, inner, strict=True):
                    item.inner = future
                    future.add_done_callback(
                        lambda done, c=client, i=item: _on_loop(loop, self._settled, c, i, done)
                    )
                    if item.answer.done():  # the client went while the batch was submitted
                        future.cancel()
        finally:
            client.feeder = None

    def _settled(self, client: _Client, item: _Item, done: Future) -> None:
        """The pool resolved an item (or dropped it: cancelled): relay, and make room."""
        client.in_pool -= 1
        if done.cancelled():
            settle(item.answer, error=ClientGone("cancelled"))
        elif done.exception() is not None:
            settle(item.answer, error=done.exception())
        else:
            settle(item.answer, done.result())
        client.changed.set()

    def _answered(self, client: _Client, item: _Item) -> None:
        """The client's answer resolved (a result, an error, or the client gave up on it)."""
        client.live.discard(item)
        if item.inner is not None and not item.inner.done():
            item.inner.cancel()  # queued in the pool: it leaves; running: its answer is dropped
        client.changed.set()


def _take(waiting: collections.deque[_Item], room: int) -> list[_Item]:
    """The next items of one deadline (one submit), ``room`` at most, skipping answered ones."""
    chunk: list[_Item] = []
    while waiting and len(chunk) < room:
        item = waiting[0]
        if item.answer.done():
            waiting.popleft()
            continue
        if chunk and item.deadline != chunk[0].deadline:
            break
        chunk.append(waiting.popleft())
    return chunk


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: object) -> None:
    """Run ``callback`` on the service's loop, from whichever thread resolved a future."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        callback(*args)
    else:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the service is gone
            loop.call_soon_threadsafe(callback, *args)
