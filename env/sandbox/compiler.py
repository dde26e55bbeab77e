"""The compile companion of a sandbox child on a GPU: a sandbox without a GPU that compiles the
solution's Triton kernels for that child, so that compiling is never held paused.

Every other sandbox of a GPU is paused while one is timed (docs/decisions.md, "Every other
sandbox of a GPU is paused while one is timed"), a child compiling its first kernels included:
with 8 evaluations in flight on an H200, a child's first call was held paused about as long as
it compiled. Compiling needs no GPU, and a process that cannot reach one cannot disturb a
measurement, so this one is never paused. It is forked like a child and isolated as a CPU child
is: its filesystem has no GPU device, and its ``ready`` message, sent before any solution code
runs here, names every one it can see; the worker hands it to no child unless that list is empty
(``compile_ahead.Companion``). It runs the same solution's code as the child it serves and
belongs to that evaluation alone: what it sends reaches only that child, which uses it only as
Triton cache files under the key Triton computes itself. A kernel compiled any other way is never
found under the child's own key, and the child then compiles it itself, as without a companion.

    worker    -> companion  {"type": "limits", ...}     (before any solution code runs here)
    companion -> worker     {"type": "ready", "gpu_devices", "isolation"}
    (the worker hands its end of the channel to the child)
    child     -> companion  {"type": "solution", "source"}
    child     -> companion  {"type": "compile", "name", "signature", "constants", "attrs",
                             "options", "target"}           (``compile_ahead.compile_request``)
    companion -> child      {"type": "compiled", "hash", "group", "files", "key_parts"}
                            | {"type": "failed", "error"}
"""

from __future__ import annotations

import json
import os
import resource
import stat
import sys
import types
from pathlib import Path
from typing import Any

ISOLATION = "not isolated"
if __name__ == "__main__":
    from kernelrl.env.sandbox.isolation import isolate

    ISOLATION = isolate(int(sys.argv[2])).describe()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernelrl.env.sandbox import harness  # noqa: E402
from kernelrl.env.sandbox.child import apply_limits, take_channel  # noqa: E402
from kernelrl.env.sandbox.protocol import (  # noqa: E402
    SOLUTION_MODULE,
    ProtocolError,
    recv_message,
    send_message,
)
from kernelrl.env.sandbox.triton_key import key_parts  # noqa: E402

GROUP_PREFIX = "__grp__"  # Triton's name for the file listing a compiled kernel's files


def nvidia_majors() -> set[int]:
    """The device numbers' majors NVIDIA's drivers registered on this host (/proc/devices)."""
    try:
        with open("/proc/devices") as table:
            rows = [line.split() for line in table]
    except OSError:
        return set()
    return {int(r[0]) for r in rows if len(r) == 2 and r[0].isdigit() and r[1].startswith("nvidia")}


def gpu_devices(root: str = "/dev", majors: set[int] | None = None) -> list[str]:
    """Every character device under ``root`` that is an NVIDIA GPU's, by its major number or
    its name, whatever path leads to it (none in the view of a CPU sandbox)."""
    majors = nvidia_majors() if majors is None else majors
    found = []
    for folder, subfolders, files in os.walk(root):
        for name in subfolders + files:
            path = os.path.join(folder, name)
            try:
                status = os.stat(path)  # through a link too
            except OSError:
                continue
            if stat.S_ISCHR(status.st_mode) and (
                os.major(status.st_rdev) in majors or name.startswith("nvidia")
            ):
                found.append(path)
    return sorted(found)


def _jit_function(module: types.ModuleType, name: str) -> Any:
    """The solution's ``@triton.jit`` function whose qualified name is ``name``."""
    found: Any = module
    for part in name.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, triton.runtime.jit.JITFunction):
        raise LookupError(f"{name} is no Triton kernel of the solution's module")
    return found


def remade(value: Any, module: types.ModuleType) -> Any:
    """The object ``compile_ahead.written`` wrote: plain values, lists and tuples as they
    are, a dtype, a constexpr, or one of the solution's kernels."""
    if type(value) in (list, tuple):
        return type(value)(remade(v, module) for v in value)
    if type(value) is not dict:
        return value
    if "dtype" in value:
        return tl.dtype(str(value["dtype"]))
    if "constexpr" in value:
        return tl.constexpr(remade(value["constexpr"], module))
    return _jit_function(module, str(value["jit_function"]))


def compile_kernel(module: types.ModuleType, message: dict[str, Any]) -> dict[str, Any]:
    """One kernel compiled for the child's GPU from what its launch gave Triton's compile;
    the files Triton cached for it, by name."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.cache import get_cache_manager

    function = _jit_function(module, str(message["name"]))
    source = ASTSource(
        function,
        {key: remade(value, module) for key, value in message["signature"].items()},
        {tuple(path): remade(value, module) for path, value in message["constants"]},
        {tuple(path): remade(value, module) for path, value in message["attrs"]},
    )
    options = {key: remade(value, module) for key, value in message["options"].items()}
    target = GPUTarget(*message["target"])
    kernel = triton.compile(source, target=target, options=options)
    folder = Path(get_cache_manager(kernel.hash).cache_dir)
    files = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    groups = [name for name in files if name.startswith(GROUP_PREFIX)]
    if len(groups) != 1:
        raise RuntimeError(f"expected one file group in Triton's cache, found {len(groups)}")
    group = files.pop(groups[0])
    listed = {Path(p).name for p in json.loads(group)["child_paths"].values()}
    return {
        "type": "compiled",
        "hash": kernel.hash,
        "group": groups[0].removeprefix(GROUP_PREFIX),
        "files": {name: data for name, data in files.items() if name in listed},
        "key_parts": _key_parts(source, target, options),
    }


def _key_parts(source: Any, target: Any, options: dict[str, Any]) -> dict[str, str]:
    """``triton_key.key_parts``, or what kept it from being computed: a detail of the child's
    record, never a reason to withhold a compiled kernel."""
    try:
        return key_parts(source, target, options)
    except Exception as exc:  # noqa: BLE001
        return {"unavailable": f"{type(exc).__name__}: {exc}"[:300]}


def serve(channel: Any) -> None:
    """Compile what the child asks for until it hangs up; a failure is said, never fatal: the
    child then compiles that kernel itself."""
    module: types.ModuleType | None = None
    loading_error = "the solution was not sent"
    while True:
        try:
            message = recv_message(channel)
        except (EOFError, OSError, ProtocolError):
            return
        if message.get("type") == "solution":
            module = None
            try:
                module = harness.load_module(str(message["source"]), SOLUTION_MODULE)
            except BaseException as exc:  # noqa: BLE001 - the solution's own code raised it
                loading_error = f"the solution did not load here: {type(exc).__name__}: {exc}"
            continue
        try:
            if module is None:
                raise RuntimeError(loading_error)
            reply = compile_kernel(module, message)
        except BaseException as exc:  # noqa: BLE001 - said to the child, which compiles itself
            reply = {"type": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        send_message(channel, reply)


def idle_priority() -> None:
    """Only CPU time nobody else wants, for good: this process runs while other evaluations
    are timed, and a solution's code here must not take cores from theirs. Every thread is
    put on SCHED_IDLE at nice 19 (those it starts later inherit it), and RLIMIT_NICE at zero
    lets no process here raise its priority again (it has no capability that would)."""
    for thread in os.listdir("/proc/self/task"):
        os.setpriority(os.PRIO_PROCESS, int(thread), 19)
        os.sched_setscheduler(int(thread), os.SCHED_IDLE, os.sched_param(0))
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))


def main() -> None:
    idle_priority()
    channel = take_channel()
    try:
        limits = recv_message(channel)
        apply_limits(limits["limits"], torch.device("cpu"))
        send_message(
            channel, {"type": "ready", "gpu_devices": gpu_devices(), "isolation": ISOLATION}
        )
        serve(channel)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_forked(parent_pid: int) -> None:
    """Entry of a companion forked by the fork server: isolated as a CPU child, then ``main``."""
    global ISOLATION
    from kernelrl.env.sandbox.isolation import isolate

    ISOLATION = isolate(parent_pid).describe()
    main()


if __name__ == "__main__":
    main()
