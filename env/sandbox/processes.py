"""Keeping warm sandbox children ready, and pausing them while another is measured.

``import torch``, CUDA context creation and CUPTI's start cost seconds, more than compiling and
checking a small kernel. Children are therefore forked from a fork server that has imported
torch once (``fork_server``, ``zygote``), and a ``ChildPool`` starts the next children while
the current evaluation runs; each child still serves exactly one solution and is then killed.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from kernelrl.env.sandbox import device_ring
from kernelrl.env.sandbox.child_process import Child, ChildDied
from kernelrl.env.sandbox.spawn import spawn_child

log = logging.getLogger(__name__)


REAPER_THREADS = 4


def _reap(child: Child, then: Callable[[], None] | None) -> None:
    try:
        child.close()
    except Exception:  # a reaper must outlive any one child
        log.exception("reaping sandbox child %s", child.process.pid)
    finally:
        if then is not None:
            then()


class ChildPool:
    """Keeps ``spare`` children warming up so that evaluations rarely wait for one.

    A new child first isolates itself and imports torch, Triton and the harness: CPU work that
    touches no GPU. It then stops at a gate (it says ``imported`` and waits) until this pool
    lets it make its CUDA context and start CUPTI, never during a measurement. A measurement
    pauses every other child; with ``pause_importing=False`` those still importing run on
    (they cannot pass the gate before it ends), so the host's cores go on starting children
    instead of idling. Off by default: timing steadiness comes first (benchmarks/README.md,
    "Environment throughput on the bundled suite").
    """

    def __init__(
        self,
        device: str,
        gpu_index: int | None = None,
        spare: int = 1,
        ready_timeout_s: float = 180.0,
        pause_importing: bool = True,
        import_timeout_s: float = 60.0,
    ) -> None:
        """``pause_importing``: pause children still importing during a measurement too (they
        are held at the gate either way); False lets them use the host's cores meanwhile."""
        self.device = device
        self.pause_importing = pause_importing
        self.gpu_index = gpu_index
        self.spare = max(spare, 0)
        self.ready_timeout_s = ready_timeout_s
        self.import_timeout_s = import_timeout_s  # to the gate: a child stuck there is replaced
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._warming: list[Child] = []
        self._live: set[Child] = set()  # every child spawned here and not yet ended
        self._gated: set[Child] = set()  # spawned, not yet let through the gate
        self._gate_errors: dict[Child, str] = {}
        self._at_gate: set[Child] = set()  # imported, waiting for a measurement to end
        self._gatekeeper: threading.Thread | None = None
        self._pausing = False
        self._closed = False
        # Reaps killed children (see ``retire``): mostly waiting for their exits, so a few
        # threads keep up with any evaluation rate.
        self._reaper = ThreadPoolExecutor(REAPER_THREADS, thread_name_prefix="kernelrl-reaper")

    def _spawn(self) -> Child:
        """Called with the lock held. The child starts importing, held at the gate."""
        child = spawn_child(self.device, self.gpu_index)
        self._live = {c for c in self._live if c.process.poll() is None} | {child}
        self._gated.add(child)
        if self._pausing and self.pause_importing:
            child.pause()
        if self._gatekeeper is None:
            self._gatekeeper = threading.Thread(
                target=self._keep_gate, name="kernelrl-sandbox-gate", daemon=True
            )
            self._gatekeeper.start()
        self._changed.notify_all()
        return child

    def _keep_gate(self) -> None:
        """Lets each child that has imported through the gate, never during a measurement."""
        while True:
            with self._lock:
                while not self._gated and not self._closed:
                    self._changed.wait(0.5)
                if self._closed:
                    return
                gated = list(self._gated)
            try:
                readable, _, _ = select.select([c.sock for c in gated], [], [], 0.05)
            except (OSError, ValueError):  # a socket closed meanwhile (acquire gave up on it)
                time.sleep(0.01)
                continue
            now = time.monotonic()
            for child in gated:
                if child.sock in readable:
                    self._pass_gate(child)  # "imported", or end of file if it died
                elif now - child.started > self.import_timeout_s and not child.killed_for:
                    child.kill("start timeout")  # its end of file comes next round

    def _pass_gate(self, child: Child) -> None:
        try:
            message = child.receive(time.monotonic() + 5.0)
            error = (
                ""
                if message.get("type") == "imported"
                else f"sent {message.get('type')!r} instead of 'imported'"
            )
        except (ChildDied, OSError) as exc:
            message, error = {}, f"failed to start: {exc}"
        with self._lock:
            self._at_gate.add(child)
            while self._pausing and not self._closed:
                self._changed.wait()
            self._at_gate.discard(child)
            if child in self._gated and not error:
                child.ready_info.update(message)
                ring, refused = device_ring.offer(self.device, self.gpu_index)
                if refused and self.device != "cpu":
                    child.ready_info["device_ring_refused"] = refused
                try:
                    child.let_through(ring)
                except OSError as exc:
                    error = f"could not be let through the gate: {exc}"
            if error:
                self._gate_errors[child] = error
            self._gated.discard(child)
            self._changed.notify_all()

    def _top_up(self) -> None:
        while len(self._warming) < self.spare and not self._closed:
            self._warming.append(self._spawn())

    @contextlib.contextmanager
    def paused_except(self, kept: Child) -> Iterator[bool]:
        """Every other child of this pool that may touch the GPU paused (``Child.pause``: all
        of its processes) while the block runs; children still importing are held at the
        gate instead, those spawned meanwhile included; yields whether any was paused.

        All of them are told to stop first and waited for after, so that the pause costs one
        child's freeze, not the sum of them."""
        with self._lock:
            self._pausing = True
            held = set() if self.pause_importing else self._gated
            others = [c for c in self._live - {kept} - held if c.process.poll() is None]
            for child in others:
                child.pause(wait_s=0.0)
            for child in others:
                child.pause()
        try:
            yield bool(others)
        finally:
            with self._lock:
                self._pausing = False
                for child in self._live - {kept}:
                    child.resume()
                self._changed.notify_all()

    def acquire(self) -> Child:
        """A child that has imported torch, made its CUDA context and said 'ready'."""
        for _ in range(3):
            with self._lock:
                if self._closed:
                    raise RuntimeError("child pool is closed")
                child = self._warming.pop(0) if self._warming else self._spawn()
                self._top_up()
                deadline = time.monotonic() + self.ready_timeout_s
                while child in self._gated and not self._closed:
                    if time.monotonic() >= deadline:
                        break
                    self._changed.wait(min(deadline - time.monotonic(), 1.0))
                stuck = child in self._gated
                self._gated.discard(child)
                gate_error = self._gate_errors.pop(child, "")
            if stuck or gate_error:
                log = child.output_tail()
                child.close()
                why = gate_error or "did not finish its imports in time"
                last_error = f"sandbox child {why}\n{log}"
                continue
            try:
                message = child.receive(deadline)
            except ChildDied as exc:
                log = child.output_tail()
                child.close()
                last_error = f"sandbox child failed to start: {exc}\n{log}"
                continue
            if message.get("type") == "ready":
                child.take_ready(message)
                return child
            child.close()
            last_error = f"sandbox child sent {message.get('type')!r} instead of 'ready'"
        raise RuntimeError(last_error)

    def retire(self, child: Child, then: Callable[[], None] | None = None) -> None:
        """Kill a child whose evaluation is over and return at once; its exit (the CUDA
        context's teardown takes a good part of a second), cgroup and scratch directory are
        reaped in the background, then ``then`` runs (e.g. giving back the GPU memory it was
        admitted with, which is only free once it has exited). The evaluation's slot is free
        meanwhile. A killed child runs nothing more, so it is no longer paused either."""
        child.send_kill("evaluation over")
        with self._lock:
            self._live.discard(child)
        try:
            self._reaper.submit(_reap, child, then)
        except RuntimeError:  # this pool is closed: reap it here
            _reap(child, then)

    def warm(self) -> None:
        with self._lock:
            self._top_up()

    def close(self) -> None:
        """Kill the spares and wait until every child, the retired ones too, is gone."""
        with self._lock:
            self._closed = True
            children, self._warming = self._warming, []
            self._gated.clear()
            self._changed.notify_all()
        for child in children:
            child.close()
        self._reaper.shutdown(wait=True)
