"""The child's side of its compile companion (``sandbox.compiler``): before Triton compiles one of
the solution's kernels, the companion compiles it, and its files go into this child's own Triton
cache, where Triton's compile then finds them under the key it computes itself.

The child wraps ``triton.compiler.compile``, which Triton's launcher calls with the kernel's
source, signature, constants, attributes and options when a launch needs a kernel it has not
compiled; what the wrapper sends is exactly those, written so that the companion remakes the
same objects. Anything it cannot write that way (a constant of a kind it does not know) is not
sent, and Triton compiles that kernel here: the wrapper never makes a launch fail.

While the child waits for the companion it launches nothing, so the pauses other evaluations'
measurements put it in cost it nothing: the companion, which has no GPU, is never paused. Where
the companion fails, is slow past ``WAIT_S`` or compiled the kernel any other way (its files
then sit under another key), Triton compiles the kernel here as it would have without one.
Nothing the companion sends is trusted beyond that: it runs the same solution's code, and its
files reach only this child's cache.
"""

from __future__ import annotations

import re
import socket
import time
from collections import Counter
from typing import Any

from kernelrl.env.sandbox.protocol import SOLUTION_MODULE, recv_message, send_message
from kernelrl.env.sandbox.triton_key import differences, key_parts

# For one kernel. Triton compiles one in under a few seconds; the companion takes only idle
# CPU time, so on a host whose cores are all busy it may get none, and the child then compiles
# that kernel and the rest itself: slower by this much at most, never failed by it.
WAIT_S = 20.0
_HASH = re.compile(r"[0-9a-f]{64}")
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}")
_MARK = b"C"


def send_companion(sock: socket.socket, channel: socket.socket) -> None:
    """The worker's side: the companion's channel to the child, right after the solution."""
    socket.send_fds(sock, [_MARK], [channel.fileno()])


def receive_companion(sock: socket.socket) -> socket.socket:
    """The child's side of ``send_companion``."""
    data, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if data != _MARK or len(fds) != 1:
        raise ConnectionError("expected the compile companion's channel")
    return socket.socket(fileno=fds[0])


class Unwritable(TypeError):
    """A value of a compile's arguments that ``written`` has no form for."""


def written(value: Any) -> Any:
    """A compile argument in a form the protocol carries (plain values, lists and tuples as
    they are) from which ``compiler.remade`` makes the same object again."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) in (list, tuple):
        return type(value)(written(v) for v in value)
    if type(value) is tl.dtype:  # a scalar type by its name (pointer and block types are not)
        return {"dtype": str(value)}
    if isinstance(value, tl.constexpr):
        return {"constexpr": written(value.value)}
    if isinstance(value, JITFunction) and value.__module__ == SOLUTION_MODULE:
        return {"jit_function": value.__qualname__}
    raise Unwritable(f"a compile argument of type {type(value).__name__}")


def compile_request(source: Any, target: Any, options: dict[str, Any]) -> dict[str, Any]:
    """What the companion needs to compile ``source`` (an ``ASTSource``) as Triton here would."""
    return {
        "type": "compile",
        "name": source.fn.__qualname__,
        "signature": {key: written(value) for key, value in source.signature.items()},
        "constants": [(path, written(value)) for path, value in source.constants.items()],
        "attrs": [(path, written(value)) for path, value in source.attrs.items()],
        "options": {key: written(value) for key, value in options.items()},
        "target": [target.backend, target.arch, target.warp_size],
    }


class CompileAhead:
    """Installed in the child once the solution is known and before it is loaded; counts what
    the companion compiled and what Triton then found in the cache (``report``, the child's
    word, for the evaluation's record)."""

    def __init__(self, channel: socket.socket, phase: dict[str, float]) -> None:
        self.channel = channel
        self.phase = phase
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.broken = False
        self.put_under: set[str] = set()  # keys the companion's kernels were put under

    def install(self, source: str) -> None:
        """The companion loads ``source`` while this child does; Triton asks it from now on."""
        import triton.compiler
        from triton import knobs

        try:
            send_message(self.channel, {"type": "solution", "source": source})
        except OSError as exc:  # gone already: Triton compiles here, as without one
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        original = triton.compiler.compile
        previous_listener = knobs.compilation.listener

        def compile(src: Any, target: Any = None, options: Any = None, **kwargs: Any) -> Any:
            function = getattr(src, "fn", None)  # a JITFunction, or none for IR text
            if target is not None and getattr(function, "__module__", "") == SOLUTION_MODULE:
                self.ask(src, target, options)
            return original(src, target=target, options=options, **kwargs)

        def listener(**kwargs: Any) -> None:
            if previous_listener is not None:
                previous_listener(**kwargs)
            function = getattr(kwargs.get("src"), "fn", None)  # a JITFunction, or IR text
            if getattr(function, "__module__", "") == SOLUTION_MODULE:
                self.counts["found" if kwargs.get("cache_hit") else "compiled_here"] += 1
                key = str((kwargs.get("metadata") or {}).get("hash", ""))
                if not kwargs.get("cache_hit") and key in self.put_under:
                    self.errors.append(
                        f"the companion's kernel was put under key {key[:12]} and not found there"
                    )

        triton.compiler.compile = compile  # what Triton's launcher calls (``create_binder``)
        knobs.compilation.listener = listener

    def ask(self, source: Any, target: Any, options: Any) -> None:
        """The companion compiles one kernel for ``target``; its files go into our cache."""
        if self.broken:
            return
        started = time.perf_counter()
        try:
            request = compile_request(source, target, dict(options or {}))
        except Exception as exc:  # noqa: BLE001 - not written (Unwritable): compiled here
            self.errors.append(f"not sent: {exc}"[:300])
            return
        try:
            send_message(self.channel, request)
            self.channel.settimeout(WAIT_S)
            reply = recv_message(self.channel)
            if reply.get("type") == "compiled":
                self.put(reply)
                self.counts["compiled_ahead"] += 1
                self.compare_keys(source, target, options, reply)
            else:
                self.errors.append(str(reply.get("error", reply.get("type")))[:300])
        except Exception as exc:  # noqa: BLE001 - any failure: Triton compiles here instead
            self.broken = True
            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        finally:
            self.phase["compile_ahead"] = (
                self.phase.get("compile_ahead", 0.0) + time.perf_counter() - started
            )

    def compare_keys(self, source: Any, target: Any, options: Any, reply: dict[str, Any]) -> None:
        """Triton's key for this compile here against the companion's, part by part: a kernel
        put under another key is not found, and the record says which part differed."""
        try:
            here = key_parts(source, target, dict(options or {}))
        except Exception as exc:  # noqa: BLE001 - a record's detail, never the compile's failure
            self.errors.append(f"key parts not computed: {type(exc).__name__}: {exc}"[:300])
            return
        if here["hash"] == reply["hash"]:
            self.put_under.add(here["hash"])
        else:
            self.errors.append(
                f"the companion's key differs: {differences(here, reply.get('key_parts'))}"
            )

    @staticmethod
    def put(reply: dict[str, Any]) -> None:
        """A compiled kernel's files into this process's Triton cache, listed as one group."""
        from triton.runtime.cache import get_cache_manager

        key, group, files = str(reply["hash"]), str(reply["group"]), dict(reply["files"])
        names = [group, *files]
        if not _HASH.fullmatch(key) or not all(_FILE.fullmatch(str(n)) for n in names):
            raise ValueError("the companion named a file outside its kernel's cache folder")
        manager = get_cache_manager(key)
        paths = {str(name): manager.put(bytes(data), str(name)) for name, data in files.items()}
        manager.put_group(group, paths)

    def report(self) -> dict[str, Any]:
        return {**self.counts, "errors": self.errors[:5]}
