"""Triton's launchers, built once per worker by a trusted process and copied into every child.

Triton 3.6 builds, for each kernel signature a process first launches, a C module with the
host's C compiler (its launcher: the arguments unpacked and ``cuLaunchKernelEx`` called), and
caches it under a hash of its source. On an H100 host that build took 0.20-0.32 s where the
compile of a short kernel itself took 0.05 s, and a child's cache starts from the seed alone
(``triton_seed``: one solution's kernels must never reach another's), so every evaluation paid
it again in its first call. A launcher's source is made from the signature alone (the argument
types), never from the kernel; so the children say which signatures they launched, the worker
checks each against the closed set of types Triton writes, a process running only Triton's own
generator and our code builds the launcher, and every child spawned afterwards gets its own copy
of the launchers built so far beside the seed. A child's report is its word and decides nothing:
the most it can do is have the worker build launchers Triton would build for some kernel (at
most ``MAX_LAUNCHERS``), and nothing a child writes reaches the folder. Where Triton builds no
launcher per signature (3.9 does not), none of this does anything.

    python -m kernelrl.env.sandbox.triton_launchers < SIGNATURES.json   (TRITON_CACHE_DIR: where)
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

from kernelrl.env.sandbox.scratch import make_scratch

log = logging.getLogger(__name__)

LAUNCHER = "__triton_launcher"  # the module name Triton builds a launcher under
MAX_LAUNCHERS = 512  # signatures a worker builds in its life
MAX_ARGUMENTS = 256  # a signature's types, tuples flattened
MAX_PER_MESSAGE = 32  # signatures taken from one message of a child
BUILD_TIMEOUT_S = 300.0
# What Triton 3.6 writes as an argument's type, pointers aside: a launcher is made of these.
_SCALAR_TYPES = frozenset(
    {"constexpr", "i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"}
    | {"fp16", "bf16", "fp32", "f32", "fp64"}
)
_POINTER_TYPE = re.compile(r"\*k?[a-z0-9]{1,16}")  # the pointee's type never reaches the source


def launcher_signature(values: Any) -> tuple | None:
    """``values`` (a child's report of one signature, tuples sent as lists) as Triton passes it
    to its launcher's generator, or None where it is not one Triton writes."""
    count = [0]

    def checked(value: Any, depth: int) -> Any:
        if isinstance(value, list) and depth < 3:
            items = tuple(checked(item, depth + 1) for item in value)
            return None if None in items else items
        if not isinstance(value, str) or count[0] >= MAX_ARGUMENTS:
            return None
        count[0] += 1
        return value if value in _SCALAR_TYPES or _POINTER_TYPE.fullmatch(value) else None

    if not isinstance(values, list):
        return None
    signature = checked(values, 0)
    return signature if signature is not None and count[0] > 0 else None


def _builds_per_signature() -> types.ModuleType | None:
    """Triton's NVIDIA driver module, where it builds a launcher per signature; else None."""
    try:
        from triton.backends.nvidia import driver
    except Exception:  # noqa: BLE001 - no NVIDIA backend here: nothing to share
        return None
    needed = ("make_launcher", "compile_module_from_src", "library_dirs", "include_dirs")
    return driver if all(hasattr(driver, name) for name in needed) else None


class LaunchersMade:
    """In a child: the signatures its Triton made a launcher for, taken by the next message to
    the worker, and the time its launchers took (found in the cache or built), as a phase."""

    def __init__(self, phase: dict[str, float]) -> None:
        self.phase = phase
        self.seen: set[str] = set()
        self.pending: list[Any] = []

    def install(self) -> None:
        driver = _builds_per_signature()
        if driver is None:
            return
        make, build = driver.make_launcher, driver.compile_module_from_src

        def recorded(constants: Any, signature: dict, tensordesc_meta: Any) -> str:
            if not tensordesc_meta:
                self.note(list(signature.values()))
            return make(constants, signature, tensordesc_meta)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return build(*args, **kwargs)
            finally:
                if kwargs.get("name") == LAUNCHER:
                    spent = time.perf_counter() - started
                    self.phase["launchers"] = self.phase.get("launchers", 0.0) + spent

        driver.make_launcher = recorded
        driver.compile_module_from_src = timed

    def note(self, values: list[Any]) -> None:
        try:  # a signature that cannot be sent is simply not reported: the launch goes on
            key = json.dumps(values)
        except (TypeError, ValueError):
            return
        if key not in self.seen:
            self.seen.add(key)
            self.pending.append(values)

    def take(self) -> list[Any]:
        taken, self.pending = self.pending, []
        return taken


class SharedLaunchers:
    """In the worker: the launchers built for the signatures children reported, in a folder
    laid out as Triton's cache is, each built once, in the background."""

    def __init__(self) -> None:
        self.enabled = _builds_per_signature() is not None
        self.folder: Path | None = None
        self.known: set[tuple] = set()
        self.pending: list[tuple] = []
        self.building = False
        self.lock = threading.Lock()
        self.built = threading.Condition(self.lock)

    def learn(self, reported: Any) -> None:
        """Build, in the background, what ``accept`` takes of a child's report."""
        if not self.enabled:
            return
        accepted = self.accept(reported)
        with self.lock:
            self.pending += accepted
            if self.pending and not self.building:
                self.building = True
                threading.Thread(target=self._build_pending, daemon=True).start()

    def accept(self, reported: Any) -> list[tuple]:
        """The signatures of a child's report not taken before, each one Triton writes, within
        the bounds; never raises, whatever was sent."""
        if not isinstance(reported, list):
            return []
        accepted: list[tuple] = []
        with self.lock:
            for values in reported[:MAX_PER_MESSAGE]:
                signature = launcher_signature(values)
                if signature is None or signature in self.known:
                    continue
                if len(self.known) >= MAX_LAUNCHERS:
                    break
                self.known.add(signature)
                accepted.append(signature)
        return accepted

    def wait(self, timeout_s: float) -> bool:
        """Whether every signature taken so far was built (or failed to be) within the time."""
        with self.lock:
            return self.built.wait_for(lambda: not self.building, timeout_s)

    def copy_into(self, cache: str | Path) -> None:
        """The launchers built so far, each key's folder whole (one is moved in at once)."""
        if self.folder is not None:
            shutil.copytree(self.folder, cache, dirs_exist_ok=True)

    def _build_pending(self) -> None:
        while True:
            with self.lock:
                batch, self.pending = self.pending, []
                if not batch:
                    self.building = False
                    self.built.notify_all()
                    return
            try:
                self._build(batch)
            except Exception:  # noqa: BLE001 - a failed build only leaves children to build
                log.warning(
                    "Triton launchers not built for %d signatures", len(batch), exc_info=True
                )

    def _build(self, batch: list[tuple]) -> None:
        if self.folder is None:
            self.folder = make_scratch("triton-launchers")
            atexit.register(shutil.rmtree, self.folder, True)
        staging = make_scratch("triton-launchers-new")
        try:
            done = subprocess.run(
                [sys.executable, "-m", __name__],
                input=json.dumps(batch),
                env={**os.environ, "TRITON_CACHE_DIR": str(staging), "CUDA_VISIBLE_DEVICES": ""},
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            if done.returncode != 0:
                log.warning("Triton launchers' build failed: %s", done.stderr[-2000:])
            for built in staging.iterdir():  # a key's folder moved whole, or not at all
                if not (self.folder / built.name).exists():
                    built.rename(self.folder / built.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


_shared: SharedLaunchers | None = None
_shared_lock = threading.Lock()


def shared_launchers() -> SharedLaunchers:
    """This worker's launchers (one for all its GPUs: a launcher is the host's code)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SharedLaunchers()
        return _shared


def main() -> None:
    """Build each signature's launcher as Triton's ``CudaLauncher`` does, into the cache."""
    signatures = []
    for values in json.load(sys.stdin):
        signature = launcher_signature(values)
        if signature is None:
            raise SystemExit(f"not a launcher's signature: {values!r}")
        signatures.append(signature)
    driver = _builds_per_signature()
    if driver is None:
        raise SystemExit("this Triton builds no launcher per signature")
    for signature in signatures:
        source = driver.make_launcher({}, dict(enumerate(signature)), None)
        driver.compile_module_from_src(
            src=source,
            name=LAUNCHER,
            library_dirs=driver.library_dirs(),
            include_dirs=driver.include_dirs,
            libraries=driver.libraries,
        )


if __name__ == "__main__":
    main()
