"""The client of a running environment service (``kernelrl env serve``): a pool like the
others, so a job switches to a shared service by setting ``env_pool: service``.

The service itself (``kernelrl.env.service``) is a named, detached Ray actor owning a pool; this
client finds it by name, hands it whole batches and gets one future per item back. A service that
dies and comes back under the same name is found again (``reconnect_timeout_s``); items it lost
are resubmitted, and fail with ``EnvServiceLost`` only when it does not come back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from kernelrl.env.pools.base import SubmitPool
from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task

SERVICE_NAME = "kernelrl-env"
NAMESPACE = "kernelrl"

log = logging.getLogger(__name__)


class ServiceClient(SubmitPool):
    """A running service, with the pool interface (``submit``, ``evaluate``, ``aevaluate``)."""

    def __init__(
        self,
        name: str = SERVICE_NAME,
        address: str | None = "auto",
        namespace: str = NAMESPACE,
        connect_timeout_s: float = 120.0,
        reconnect_timeout_s: float = 300.0,
    ) -> None:
        """``address``: the cluster to join when this process is not connected to Ray yet
        ("auto": the cluster on this machine, or ``RAY_ADDRESS``; else "host:port").
        ``reconnect_timeout_s``: how long to wait for a service that died (restarted, its node
        lost) to come back under the same name before its items fail with
        ``EnvServiceLost``; 0 fails them at once."""
        import ray

        self._started_ray = connect_ray(address, namespace)
        try:
            self.actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            self.close()
            raise ValueError(
                f"no kernelrl environment service named {name!r} in namespace {namespace!r}"
                " on this cluster (start one with `kernelrl env serve`)"
            ) from None
        info = ray.get(self.actor.info.remote(), timeout=connect_timeout_s)
        self.name = name
        self.namespace = namespace
        self.reconnect_timeout_s = reconnect_timeout_s
        self.reconnects = 0
        self._started = info["started"]  # tells one incarnation of the service from the next
        self._lock = threading.Lock()
        self._lost: dict[float, str] = {}  # dead incarnation -> why its items failed
        self.device = info["device"]
        self.device_name = info["device_name"]
        self.versions = info["versions"]
        self.num_slots = info["num_slots"]
        self.address = ray.get_runtime_context().gcs_address

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        import ray

        if len(tasks) != len(solutions):
            raise ValueError(f"{len(tasks)} tasks but {len(solutions)} solutions")
        if not tasks:
            return []
        tasks, solutions = list(tasks), list(solutions)
        while True:
            incarnation = self._incarnation()
            actor = incarnation[0]
            try:
                batch = ray.get(actor.submit.remote(tasks, solutions, timeout_s))
                break
            except ray.exceptions.RayActorError:
                self._reconnect(incarnation)
        refs = [actor.result.remote(batch, index) for index in range(len(tasks))]
        return [
            self._resubmitted_if_lost(
                _unwrapped(ref.future()), incarnation, task, solution, timeout_s
            )
            for ref, task, solution in zip(refs, tasks, solutions, strict=True)
        ]

    def _resubmitted_if_lost(
        self,
        future: Future,
        incarnation: tuple[Any, float],
        task: Task,
        solution: str,
        timeout_s: float | None,
    ) -> Future:
        """The item's result; if the service died before answering, the same item evaluated by
        the service that replaced it (an evaluation depends only on the task and the solution,
        so asking again is safe, and the reward is a real evaluation's). If none comes back in
        ``reconnect_timeout_s``, the item fails with ``EnvServiceLost``: never a made-up result."""
        import ray

        relayed: Future = Future()

        def relay(done: Future) -> None:
            error = done.exception()
            if not isinstance(error, ray.exceptions.RayActorError):
                _copy_outcome(done, relayed)
                return
            threading.Thread(target=retry, args=(error,), daemon=True).start()

        def retry(error: BaseException) -> None:
            try:
                self._reconnect(incarnation)
                again = self.submit([task], [solution], timeout_s)[0]
            except BaseException as exc:  # EnvServiceLost, or the client was closed
                relayed.set_exception(exc)
                return
            again.add_done_callback(lambda done: _copy_outcome(done, relayed))

        future.add_done_callback(relay)
        return relayed

    def _reconnect(self, dead: tuple[Any, float]) -> None:
        """Wait for a live incarnation of the service other than ``dead`` (an actor handle and
        its start time): Ray restarting the same actor after its process died, or a new
        ``kernelrl env serve`` under the same name. One restart serves every waiting item."""
        import ray

        deadline = time.monotonic() + self.reconnect_timeout_s
        with self._lock:
            if dead[1] in self._lost:
                raise EnvServiceLost(self._lost[dead[1]])
            while self._incarnation()[1] == dead[1]:
                try:
                    actor = ray.get_actor(self.name, namespace=self.namespace)
                    started = ray.get(actor.info.remote(), timeout=30)["started"]
                    if started != dead[1]:
                        self.actor, self._started = actor, started
                        self.reconnects += 1
                        log.warning("environment service %r is back; resubmitting", self.name)
                        return
                except (ValueError, ray.exceptions.RayError):
                    pass  # not registered again yet, or still starting
                if time.monotonic() >= deadline:
                    self._lost[dead[1]] = (
                        f"environment service {self.name!r} died and did not come back within "
                        f"{self.reconnect_timeout_s:.0f} s (restart it with `kernelrl env serve`"
                        ", then resume the run from its last checkpoint)"
                    )
                    raise EnvServiceLost(self._lost[dead[1]])
                time.sleep(1.0)

    def _incarnation(self) -> tuple[Any, float]:
        return self.actor, self._started

    def stats(self) -> dict[str, Any]:
        import ray

        return ray.get(self.actor.stats.remote())

    def close(self) -> None:
        """Disconnect (the service keeps running)."""
        import ray

        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_ray(address: str | None, namespace: str) -> bool:
    """Join the cluster at ``address`` ("auto": the one on this machine, or ``RAY_ADDRESS``)
    unless this process is connected already; True if this call connected."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        # Ray reads the mode when it is imported; a process that opted in later (a notebook,
        # a test) refreshes it the way ray.init does when it turns token mode on itself.
        from ray._raylet import Config

        Config.initialize("")
    try:
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)
    except ConnectionError as exc:
        hint = (
            ""
            if os.environ.get("RAY_AUTH_MODE")
            else " (a cluster with token authentication, Ray's default for local ones,"
            " needs RAY_AUTH_MODE=token and its token in ~/.ray/auth_token)"
        )
        raise ValueError(f"cannot reach a Ray cluster at {address or 'auto'}: {exc}{hint}") from exc
    return True


class EnvServiceLost(RuntimeError):
    """The environment service died and no service of the same name came back in time."""


def _copy_outcome(done: Future, into: Future) -> None:
    if into.done():
        return
    error = done.exception()
    if error is None:
        into.set_result(done.result())
    else:
        into.set_exception(error)


def _unwrapped(ray_future: Future) -> Future:
    """Ray wraps an exception raised in the actor (a TaskError for a broken task) in a
    RayTaskError; callers of a pool expect the original exception, as LocalPool gives it."""
    future: Future = Future()

    def relay(done: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        error = done.exception()
        if error is None:
            future.set_result(done.result())
            return
        cause = getattr(error, "cause", None)
        future.set_exception(cause if isinstance(cause, BaseException) else error)

    ray_future.add_done_callback(relay)
    return future
