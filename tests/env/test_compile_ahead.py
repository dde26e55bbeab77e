"""Compiling ahead (``sandbox.compiler``, ``sandbox.compile_ahead``): a companion sandbox without a
GPU compiles a solution's Triton kernel for the child's GPU, and Triton in another process finds
it under the key it computes itself."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_manager
from triton.runtime.jit import JitFunctionInfo

from kernelrl.data.bundled import bundled_pairs, bundled_solution_path
from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.result import Status
from kernelrl.env.sandbox import compile_ahead, harness
from kernelrl.env.sandbox.child_process import Child
from kernelrl.env.sandbox.companion import Companion, child_report
from kernelrl.env.sandbox.compile_ahead import CompileAhead
from kernelrl.env.sandbox.protocol import SOLUTION_MODULE, send_message
from kernelrl.env.sandbox.session import SandboxSession
from kernelrl.env.sandbox.spawn import spawn_companion

# The bundled ReLU solution, launched as its forward launches it on float32 inputs.
SOLUTION = bundled_solution_path("01_relu", "triton").read_text()
TARGET = GPUTarget("cuda", 90, 32)  # an H100's or H200's
TARGET_LIST = [TARGET.backend, TARGET.arch, TARGET.warp_size]  # as a child sends it
SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK_SIZE": "constexpr"}
CONSTANTS = {(3,): 1024}  # paths of arguments, as the launcher gives them
ATTRS = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
LIMITS = {"file_bytes": 2**30, "cpu_seconds": 300, "address_space_bytes": 16 * 2**30}


def _specialization(name: str) -> str:
    """What Triton's launcher gives its ``jit_cache_hook`` for this launch, written as it does."""
    options = make_backend(TARGET).parse_options({"num_warps": 4})
    return json.dumps(
        {
            "name": f"{SOLUTION_MODULE}.{name}",
            "signature": SIGNATURE,
            "constant_keys": [list(key) for key in CONSTANTS],
            "constant_vals": list(CONSTANTS.values()),
            "attrs_keys": [list(key) for key in ATTRS],
            "attrs_vals": list(ATTRS.values()),
            "options": options.__dict__,
            "key": "",
        }
    )


@pytest.fixture
def companion() -> Child:
    started = spawn_companion("cpu", None).result(timeout=120)
    yield started
    started.close()


def _ready(companion: Child) -> dict:
    companion.send({"type": "limits", "limits": LIMITS})
    return companion.receive(time.monotonic() + 60)


def test_a_companion_sees_no_gpu_and_takes_only_idle_cpu_time(companion: Child) -> None:
    ready = _ready(companion)
    assert ready["type"] == "ready" and ready["gpu_devices"] == [], ready
    job = companion._tree()[-1]  # the process that will run the solution's code
    assert os.sched_getscheduler(job) == os.SCHED_IDLE
    assert os.getpriority(os.PRIO_PROCESS, job) == 19


def test_a_gpu_device_is_found_by_its_number_whatever_it_is_called(tmp_path: Path) -> None:
    """Where a view showed a GPU's device under another name (a link, a copy of the node), the
    companion's ready message still lists it: the number says what a device is."""
    from kernelrl.env.sandbox.compiler import gpu_devices

    try:
        os.mknod(tmp_path / "renamed", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
    except PermissionError:
        pytest.skip("no permission to make a device node here")
    (tmp_path / "nvidia0").write_text("a file, not a device")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "1:3").symlink_to(tmp_path / "renamed")
    assert gpu_devices(str(tmp_path), majors=set()) == []
    assert gpu_devices(str(tmp_path), majors={1}) == [
        str(tmp_path / "links" / "1:3"),
        str(tmp_path / "renamed"),
    ]


def test_the_child_s_hook_has_the_companion_compile_what_triton_then_finds(
    companion: Child, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's side as Triton's launcher drives it, with this process as the child: the
    hook, called before a compile with the launch's specialization, has the companion compile
    the kernel for an sm_90 GPU and puts its files into an empty cache; Triton's compile of the
    same kernel here then finds them (a cache hit, the companion's hash), and the listener
    counts it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.compilation, "listener", None)
    _ready(companion)
    phase: dict[str, float] = {}
    ahead = CompileAhead(companion.sock, phase, target=TARGET)
    ahead.install(SOLUTION)
    module = harness.load_module(SOLUTION, SOLUTION_MODULE)
    try:
        skipped = knobs.runtime.jit_cache_hook(
            key=None,
            repr="relu_kernel",
            fn=JitFunctionInfo(SOLUTION_MODULE, "relu_kernel", module.relu_kernel),
            compile={"specialization_data": _specialization("relu_kernel")},
            is_manual_warmup=False,
            already_compiled=False,
        )
        options = make_backend(TARGET).parse_options({"num_warps": 4}).__dict__
        source = ASTSource(module.relu_kernel, SIGNATURE, CONSTANTS, ATTRS)
        kernel = triton.compile(source, target=TARGET, options=options)
    finally:
        sys.modules.pop(SOLUTION_MODULE, None)
    assert not skipped
    assert ahead.report() == {"compiled_ahead": 1, "found": 1, "errors": []}, ahead.report()
    assert phase["compile_ahead"] > 0
    folder = Path(get_cache_manager(kernel.hash).cache_dir)
    assert folder.is_relative_to(tmp_path) and any(p.suffix == ".cubin" for p in folder.iterdir())


def test_what_the_companion_cannot_compile_is_said_and_it_goes_on(companion: Child) -> None:
    """A kernel it cannot find, then one it can: a failure is a reply, never its end."""
    _ready(companion)
    send_message(companion.sock, {"type": "solution", "source": SOLUTION})
    for name, expected in (("no_such_kernel", "failed"), ("relu_kernel", "compiled")):
        send_message(
            companion.sock,
            {"type": "compile", "specialization": _specialization(name), "target": TARGET_LIST},
        )
        reply = companion.receive(time.monotonic() + 120)
        assert reply["type"] == expected, reply
    # A solution that does not load here (its own SystemExit included): each request is
    # answered with why, and the companion is still there for the next.
    send_message(companion.sock, {"type": "solution", "source": "raise SystemExit(3)\n"})
    for _ in range(2):
        send_message(
            companion.sock,
            {
                "type": "compile",
                "specialization": _specialization("relu_kernel"),
                "target": TARGET_LIST,
            },
        )
        reply = companion.receive(time.monotonic() + 60)
        assert reply["type"] == "failed" and "did not load here: SystemExit" in reply["error"]


def test_a_companion_that_does_not_answer_in_time_is_asked_nothing_more(
    companion: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A companion given no CPU time (here: stopped) costs its child ``WAIT_S`` once; the child
    then compiles that kernel and every later one itself."""
    monkeypatch.setattr(compile_ahead, "WAIT_S", 0.5)
    _ready(companion)
    companion.pause()
    phase: dict[str, float] = {}
    ahead = CompileAhead(companion.sock, phase, target=TARGET)
    ahead.ask(_specialization("relu_kernel"))
    waited = phase["compile_ahead"]
    ahead.ask(_specialization("relu_kernel"))
    assert ahead.broken and ahead.errors[0].startswith("TimeoutError")
    assert 0.5 <= waited < 2.0 and phase["compile_ahead"] - waited < 0.1
    companion.resume()


@pytest.mark.parametrize("companion_starts", [True, False])
def test_a_child_is_handed_its_companion_with_the_solution_or_goes_on_without(
    companion_starts: bool,
) -> None:
    """The worker's side on a CPU (where Triton interprets, so nothing is asked): a companion
    that said it sees no GPU is handed to the child with the solution, which loads as before
    and tells it the solution; one that died first is not handed, and the child loads alike."""
    task, solution = bundled_pairs("triton")[0]
    evaluator = Evaluator(EvalConfig(device="cpu", spare_children=0))
    child = evaluator.children.acquire()
    companion = Companion("cpu", None, LIMITS)
    if not companion_starts:
        companion.future.result(timeout=60).kill()
    try:
        session = SandboxSession(child, 120, None, None, companion)
        job = evaluator._child_job(task, solution, 0, evaluator.config.timing)
        loaded = session.start(job)
    finally:
        record: dict = {}
        companion.retire(evaluator.children.retire, record)
        evaluator.children.retire(child)
        evaluator.close()
    assert loaded["type"] == "loaded", loaded
    if companion_starts:
        assert record["compile_ahead"] == {"companion": "handed to the child"}
        assert loaded["compile_ahead"] == {"errors": []}  # the child's word: nothing asked yet
    else:
        assert record["compile_ahead"]["companion"].startswith("not started: ")
        assert "compile_ahead" not in loaded


@pytest.mark.parametrize(
    "reply",
    [
        {"hash": "../" + "0" * 61, "group": "k.json", "files": {}},
        {"hash": "0" * 64, "group": "k.json", "files": {"../../x.so": b""}},
        {"hash": "0" * 64, "group": "/etc/k.json", "files": {}},
    ],
)
def test_a_companion_s_files_go_into_the_kernel_s_cache_folder_only(reply: dict) -> None:
    with pytest.raises(ValueError, match="outside its kernel's cache folder"):
        CompileAhead.put(reply)


def test_the_child_s_report_of_its_companion_is_kept_as_plain_counts() -> None:
    assert child_report({"compiled_ahead": 2, "found": 2, "errors": ["x" * 900] * 9}) == {
        "compiled_ahead": 2,
        "found": 2,
        "errors": ["x" * 300] * 5,
    }
    assert child_report(["not", "a", "dict"]) == {}
    assert child_report({"found": "many", "errors": "no"}) == {"errors": []}


@pytest.mark.gpu
def test_a_gpu_evaluation_finds_its_kernels_compiled_by_its_companion() -> None:
    """On a GPU, every kernel of the bundled Triton solutions is compiled by the companion and
    found in the child's cache; the verdicts are those without one."""
    evaluator = Evaluator(EvalConfig(device="cuda", compile_ahead=True, spare_children=2))
    try:
        for task, solution in bundled_pairs("triton")[:4]:
            result = evaluator.evaluate(task, solution)
            assert result.status is Status.CORRECT, (task.id, result.error)
            record = result.sandbox["compile_ahead"]
            assert record["companion"] == "handed to the child", record
            assert record["found"] >= 1 and record.get("compiled_here", 0) == 0, record
            assert result.phase_seconds["child_compile_ahead"] > 0
    finally:
        evaluator.close()
