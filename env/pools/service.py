"""The client of a running environment service (``kernelrl env serve``): a pool like the
others, so a job switches to a shared service by setting ``env_pool: service``.

The service itself (``kernelrl.env.service``) is a named, detached Ray actor owning a pool; this
client finds it by name, hands it batches and gets one future per item back. A service that dies
and comes back under the same name is found again (``reconnect_timeout_s``); items it lost are
resubmitted, and fail with ``EnvServiceLost`` only when it does not come back.

Every call presents the service's bearer token (``read_token``: ``$KERNELRL_ENV_TOKEN``, else the
file ``serve`` wrote, mode 0600, under ``$KERNELRL_HOME``). The client is one identity to the
service: it sends batches of at most the service's ``max_items_per_request`` and renews a lease
while it lives, so that when its process dies the service cancels everything it queued.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from kernelrl.env.pools.base import SubmitPool
from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task

SERVICE_NAME = "kernelrl-env"
NAMESPACE = "kernelrl"
HOME_ENV = "KERNELRL_HOME"
_SERVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- the token
def check_service_name(name: str) -> str:
    """A service name is part of a file name (its token's): letters, digits, ``.``, ``_``, ``-``."""
    if not isinstance(name, str) or not _SERVICE_NAME.fullmatch(name):
        raise ValueError(
            f"service name {name!r} must be 1-100 letters, digits, '.', '_' or '-' (not first)"
        )
    return name


def token_path(name: str = SERVICE_NAME) -> Path:
    """Where ``kernelrl env serve`` keeps the token of service ``name`` on its machine."""
    home = os.environ.get(HOME_ENV) or Path.home() / ".cache" / "kernelrl"
    return Path(home) / f"env-{check_service_name(name)}.token"


def token_variable(name: str = SERVICE_NAME) -> str:
    """The environment variable that gives service ``name``'s token on a machine without its
    file: one per service, so a client of one never presents another's (``kernelrl-env``:
    ``KERNELRL_ENV_TOKEN``; ``kernelrl-openenv``: ``KERNELRL_OPENENV_TOKEN``)."""
    stem = re.sub(r"[^A-Za-z0-9]", "_", name.removeprefix("kernelrl-")).upper()
    return f"KERNELRL_{stem}_TOKEN"


TOKEN_ENV = token_variable(SERVICE_NAME)


def read_token(name: str = SERVICE_NAME) -> str:
    """The bearer token of service ``name``: ``$KERNELRL_ENV_TOKEN`` (``token_variable``) when
    set (a client on another machine), else the file ``serve`` wrote (``token_path``), which must be this
    user's and private: a token file others can read or replace is refused, not trusted.
    Every client of the service (``ServiceClient``, ``kernelrl env status/stop``, HTTP
    clients) reads it here. ValueError, one line, when there is none."""
    variable = token_variable(name)
    given = os.environ.get(variable, "").strip()
    if given:
        return given
    path = token_path(name)
    try:
        token = _read_private(path)
    except FileNotFoundError:
        raise ValueError(
            f"no token for environment service {name!r}: {path} does not exist (`kernelrl env"
            f" serve` writes it on the machine it runs on; elsewhere set {variable})"
        ) from None
    except OSError as exc:  # a symlink (ELOOP), a folder we may not enter
        raise ValueError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def write_token(name: str = SERVICE_NAME) -> tuple[str, Path]:
    """A new random token for service ``name``, written where ``read_token`` finds it: created
    with mode 0600 under a random name, then renamed over the old one, so it is never readable
    by others, not even for a moment, and a reader sees the old token or the new one whole. An
    existing file that is not this user's, or that others may read, is refused (someone may be
    reading it, or planting their own)."""
    path = token_path(name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        _check_private(os.lstat(path), path)
    token = secrets.token_urlsafe(32)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(token + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return token, path


def remove_token(name: str, token: str) -> None:
    """Remove the token file of ``name`` if it still holds ``token`` (a newer ``serve`` of the
    same name has its own: that one stays)."""
    path = token_path(name)
    with contextlib.suppress(OSError, ValueError):  # gone, or not ours: left alone
        if hmac.compare_digest(_read_private(path).encode(), token.encode()):
            path.unlink()


def token_digest(token: str) -> bytes:
    """What the service keeps of its token: a digest, so the secret itself is in no Ray state
    (actor arguments, Serve's deployment config) that an operator may dump."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def token_matches(given: Any, digest: bytes) -> bool:
    """Constant-time comparison of a presented token with the service's digest."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(token_digest(given), digest)


def _read_private(path: Path) -> str:
    """The text of a token file that is this user's alone: no link followed, no FIFO waited
    on (O_NONBLOCK), and checked on the open file itself, so it cannot be swapped meanwhile."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags)) as file:
        _check_private(os.fstat(file.fileno()), path)
        return file.read(4096).strip()


def _check_private(status: os.stat_result, path: Path) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(f"refusing the token file {path}: it is not a regular file")
    if status.st_uid != os.getuid():
        raise ValueError(
            f"refusing the token file {path}: it belongs to uid {status.st_uid}, not to this user"
        )
    if status.st_mode & 0o077:
        raise ValueError(
            f"refusing the token file {path}: mode {stat.S_IMODE(status.st_mode):o} lets other"
            " users read or change it (remove it; `kernelrl env serve` writes a private one)"
        )


# ---------------------------------------------------------------------------------- the client
class ServiceClient(SubmitPool):
    """A running service, with the pool interface (``submit``, ``evaluate``, ``aevaluate``)."""

    def __init__(
        self,
        name: str = SERVICE_NAME,
        address: str | None = "auto",
        namespace: str = NAMESPACE,
        connect_timeout_s: float = 120.0,
        reconnect_timeout_s: float = 300.0,
        token: str | None = None,
    ) -> None:
        """``address``: the cluster to join when this process is not connected to Ray yet
        ("auto": the cluster on this machine, or ``RAY_ADDRESS``; else "host:port").
        ``reconnect_timeout_s``: how long to wait for a service that died (restarted, its node
        lost) to come back under the same name before its items fail with
        ``EnvServiceLost``; 0 fails them at once. ``token``: the service's bearer token
        (default: ``read_token(name)``, read again when the service comes back)."""
        import ray

        self._given_token = token
        self._started_ray = connect_ray(address, namespace)
        try:
            self.actor = ray.get_actor(name, namespace=namespace)
            self._token = token or read_token(name)
        except ValueError:
            self.close()
            if hasattr(self, "actor"):  # found, but no token for it here
                raise
            raise ValueError(
                f"no kernelrl environment service named {name!r} in namespace {namespace!r}"
                " on this cluster (start one with `kernelrl env serve`)"
            ) from None
        try:
            info = ray.get(self.actor.info.remote(self._token), timeout=connect_timeout_s)
        except PermissionError as exc:
            self.close()
            raise ValueError(f"environment service {name!r}: {_first_line(exc)}") from None
        self.name = name
        self.namespace = namespace
        self.reconnect_timeout_s = reconnect_timeout_s
        self.reconnects = 0
        self.client_id = uuid.uuid4().hex  # this client's identity to the service
        self._started = info["started"]  # tells one incarnation of the service from the next
        self._lock = threading.Lock()
        self._lost: dict[float, str] = {}  # dead incarnation -> why its items failed
        self.device = info["device"]
        self.device_name = info["device_name"]
        self.versions = info["versions"]
        self.num_slots = info["num_slots"]
        self.max_items = int(info["max_items_per_request"])
        self.address = ray.get_runtime_context().gcs_address
        self._closed = threading.Event()
        self._lease = threading.Thread(
            target=self._renew_lease, args=(float(info["client_lease_s"]),), daemon=True
        )
        self._lease.start()

    def submit(
        self, tasks: Sequence[Task], solutions: Sequence[str], timeout_s: float | None = None
    ) -> list[Future[EvalResult]]:
        """One future per item. Batches larger than the service takes in one request are sent
        in parts; each part waits while this client has its share of the service queued."""
        import ray

        if len(tasks) != len(solutions):
            raise ValueError(f"{len(tasks)} tasks but {len(solutions)} solutions")
        futures: list[Future[EvalResult]] = []
        for start in range(0, len(tasks), self.max_items):
            part = slice(start, start + self.max_items)
            tasks_part, solutions_part = list(tasks[part]), list(solutions[part])
            while True:
                incarnation = self._incarnation()
                actor = incarnation[0]
                try:
                    batch = ray.get(
                        actor.submit.remote(
                            self._token, self.client_id, tasks_part, solutions_part, timeout_s
                        )
                    )
                    break
                except ray.exceptions.RayActorError:
                    self._reconnect(incarnation)
            refs = [actor.result.remote(self._token, batch, i) for i in range(len(tasks_part))]
            futures += [
                self._resubmitted_if_lost(
                    _unwrapped(ref.future()), incarnation, task, solution, timeout_s
                )
                for ref, task, solution in zip(refs, tasks_part, solutions_part, strict=True)
            ]
        return futures

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
                    # a new `serve` has a new token: read it again, unless one was given
                    token = self._given_token or read_token(self.name)
                    actor = ray.get_actor(self.name, namespace=self.namespace)
                    started = ray.get(actor.info.remote(token), timeout=30)["started"]
                    if started != dead[1]:
                        self.actor, self._started, self._token = actor, started, token
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

        return ray.get(self.actor.stats.remote(self._token))

    def _renew_lease(self, lease_s: float) -> None:
        """Tell the service this client lives, a few times per lease: a client whose process
        died stops, and the service cancels what it queued once the lease runs out."""
        import ray

        while not self._closed.wait(lease_s / 4):
            try:
                ray.get(self.actor.heartbeat.remote(self._token, self.client_id), timeout=lease_s)
            except Exception as exc:  # restarting, or Ray is shutting down: the next one counts
                log.debug("environment service lease not renewed: %s", _first_line(exc))

    def close(self) -> None:
        """Disconnect: what this client still has queued is cancelled (nobody will collect
        it); the service keeps running."""
        import ray

        closed = getattr(self, "_closed", None)
        if closed is not None and not closed.is_set():
            closed.set()
            try:
                ray.get(self.actor.release.remote(self._token, self.client_id), timeout=30)
            except Exception as exc:  # gone already: its lease lapses there
                log.debug("environment service release: %s", _first_line(exc))
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


def _first_line(exc: BaseException) -> str:
    """A Ray error's own message (Ray prefixes the remote traceback)."""
    cause = getattr(exc, "cause", None)
    text = str(cause if isinstance(cause, BaseException) else exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


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
