"""Compiling ahead (``sandbox.compiler``, ``sandbox.compile_ahead``): a companion sandbox without a
GPU compiles a solution's Triton kernel for the child's GPU, and Triton in another process finds
it under the key it computes itself."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest
import triton
import triton.compiler
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_manager

from kernelrl.data.bundled import bundled_pairs, bundled_solution_path
from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.result import Status
from kernelrl.env.sandbox import companion as companion_module
from kernelrl.env.sandbox import compile_ahead, harness
from kernelrl.env.sandbox.child_process import Child
from kernelrl.env.sandbox.companion import Companion, child_report
from kernelrl.env.sandbox.compile_ahead import CompileAhead, Unwritable, compile_request, written
from kernelrl.env.sandbox.compiler import remade
from kernelrl.env.sandbox.protocol import SOLUTION_MODULE, send_message
from kernelrl.env.sandbox.session import SandboxSession
from kernelrl.env.sandbox.spawn import spawn_companion

# The bundled ReLU solution, compiled as its forward's launch asks on float32 inputs.
SOLUTION = bundled_solution_path("01_relu", "triton").read_text()
TARGET = GPUTarget("cuda", 90, 32)  # an H100's or H200's
SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK_SIZE": "constexpr"}
CONSTANTS = {(3,): 1024}  # paths of arguments, as the launcher gives them
ATTRS = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
LIMITS = {"file_bytes": 2**30, "cpu_seconds": 300, "address_space_bytes": 16 * 2**30}


@triton.jit
def _not_the_solutions(x):  # a kernel of another module: not the solution's to send
    pass


@pytest.fixture
def compiling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """This process compiles (not interprets) into an empty cache, as a child on a GPU does;
    what a child's side installs in Triton, and the solution's module, are gone after."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(triton.compiler, "compile", triton.compiler.compile)
    monkeypatch.setattr(knobs.compilation, "listener", None)
    yield
    sys.modules.pop(SOLUTION_MODULE, None)


@pytest.fixture
def solution(compiling):
    """The solution's module in this process."""
    return harness.load_module(SOLUTION, SOLUTION_MODULE)


def _source(module, name: str = "relu_kernel") -> ASTSource:
    return ASTSource(getattr(module, name), SIGNATURE, CONSTANTS, ATTRS)


def _options() -> dict:
    return make_backend(TARGET).parse_options({"num_warps": 4}).__dict__


def _request(module, name: str = "relu_kernel") -> dict:
    request = compile_request(_source(module), TARGET, _options())
    return {**request, "name": name}


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


def test_a_compile_s_arguments_are_written_and_remade_as_they_were(solution) -> None:
    """What Triton's compile is given, through the protocol and back: dtypes, constexprs, the
    solution's own kernels, tuples and lists as they were; anything else is not sent."""
    values = [tl.float16, tl.constexpr(8), (1, (2, "x")), [["tt.divisibility", 16]], None, 2.5]
    values.append(solution.relu_kernel)
    assert [remade(written(value), solution) for value in values] == values
    for unknown in (object(), {"a": 1}, _not_the_solutions, tl.pointer_type(tl.float32)):
        with pytest.raises(Unwritable):
            written(unknown)


def test_the_child_s_compile_has_the_companion_compile_what_triton_then_finds(
    companion: Child, solution, tmp_path: Path
) -> None:
    """The child's side with this process as the child, called as Triton's launcher calls its
    compile: the companion compiles the kernel for an sm_90 GPU, its files go into an empty
    cache, and Triton's own compile, right after, finds them (a cache hit; the listener
    counts it). Only the solution's kernels are asked about."""
    _ready(companion)
    phase: dict[str, float] = {}
    ahead = CompileAhead(companion.sock, phase)
    ahead.install(SOLUTION)
    kernel = triton.compiler.compile(_source(solution), target=TARGET, options=_options())
    assert ahead.report() == {"compiled_ahead": 1, "found": 1, "errors": []}, ahead.report()
    assert phase["compile_ahead"] > 0
    folder = Path(get_cache_manager(kernel.hash).cache_dir)
    assert folder.is_relative_to(tmp_path) and any(p.suffix == ".cubin" for p in folder.iterdir())


def test_a_companion_s_kernel_under_another_key_is_named_by_the_part_that_differed(
    companion: Child, solution, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The companion compiles with one option other than the child's (as a companion whose
    Triton saw another environment would): its files sit under another key, Triton compiles
    the kernel here, and the child's record names the option with both values."""
    _ready(companion)
    ahead = CompileAhead(companion.sock, {})
    ahead.install(SOLUTION)
    request = compile_ahead.compile_request

    def with_eight_warps(source, target, options):
        return request(source, target, {**options, "num_warps": 8})

    monkeypatch.setattr(compile_ahead, "compile_request", with_eight_warps)
    triton.compiler.compile(_source(solution), target=TARGET, options=_options())
    report = ahead.report()
    assert report["compiled_ahead"] == 1 and report["compiled_here"] == 1, report
    assert "found" not in report, report
    [error] = report["errors"]
    assert "option num_warps (4 here, 8 there)" in error, error


def test_a_companion_s_kernel_missing_under_the_same_key_is_said_so(
    companion: Child, solution, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys agree but the files are not where Triton looks (here: never put): the record
    says the kernel was put under that key and not found, the other cause of a miss."""
    _ready(companion)
    ahead = CompileAhead(companion.sock, {})
    ahead.install(SOLUTION)
    monkeypatch.setattr(CompileAhead, "put", staticmethod(lambda reply: None))
    kernel = triton.compiler.compile(_source(solution), target=TARGET, options=_options())
    report = ahead.report()
    assert report["compiled_here"] == 1 and "found" not in report, report
    assert report["errors"] == [
        f"the companion's kernel was put under key {kernel.hash[:12]} and not found there"
    ], report


# A kernel given another of the solution's kernels as a constexpr: the case Triton 3.6's own
# serialisation of a launch (for its jit_cache_hook) has no form for.
KERNEL_AS_CONSTANT = """
import triton
import triton.language as tl


@triton.jit
def square(x):
    return x * x


@triton.jit
def apply(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, FN(tl.load(x_ptr + offsets, mask=mask)), mask=mask)
"""


def test_a_kernel_passed_as_a_constant_is_compiled_ahead_too(companion: Child, compiling) -> None:
    _ready(companion)
    ahead = CompileAhead(companion.sock, {})
    ahead.install(KERNEL_AS_CONSTANT)
    module = harness.load_module(KERNEL_AS_CONSTANT, SOLUTION_MODULE)
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
    signature |= {"FN": "constexpr", "BLOCK": "constexpr"}
    source = ASTSource(module.apply, signature, {(3,): module.square, (4,): 256}, ATTRS)
    triton.compiler.compile(source, target=TARGET, options=_options())
    assert ahead.report() == {"compiled_ahead": 1, "found": 1, "errors": []}, ahead.report()


def test_what_the_companion_cannot_compile_is_said_and_it_goes_on(
    companion: Child, solution
) -> None:
    """A kernel it cannot find, then one it can; a solution that does not load there (its own
    SystemExit included): each request is answered with why, and it is there for the next."""
    _ready(companion)
    send_message(companion.sock, {"type": "solution", "source": SOLUTION})
    for name, expected in (("no_such_kernel", "failed"), ("relu_kernel", "compiled")):
        send_message(companion.sock, _request(solution, name))
        reply = companion.receive(time.monotonic() + 120)
        assert reply["type"] == expected, reply
    send_message(companion.sock, {"type": "solution", "source": "raise SystemExit(3)\n"})
    for _ in range(2):
        send_message(companion.sock, _request(solution))
        reply = companion.receive(time.monotonic() + 60)
        assert reply["type"] == "failed" and "did not load here: SystemExit" in reply["error"]


def test_a_companion_that_does_not_answer_in_time_is_asked_nothing_more(
    companion: Child, solution, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A companion given no CPU time (here: stopped) costs its child ``WAIT_S`` once; the child
    then compiles that kernel and every later one itself."""
    monkeypatch.setattr(compile_ahead, "WAIT_S", 0.5)
    _ready(companion)
    companion.pause()
    phase: dict[str, float] = {}
    ahead = CompileAhead(companion.sock, phase)
    ahead.ask(_source(solution), TARGET, _options())
    waited = phase["compile_ahead"]
    ahead.ask(_source(solution), TARGET, _options())
    assert ahead.broken and ahead.errors[0].startswith("TimeoutError")
    assert 0.5 <= waited < 2.0 and phase["compile_ahead"] - waited < 0.1
    companion.resume()


def test_a_companion_ready_long_before_the_solution_is_still_handed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large task takes its child seconds to load: the wait for the companion starts when
    the solution is sent, and one started long before is handed at once."""
    monkeypatch.setattr(companion_module, "START_S", 0.5)
    companion = Companion("cpu", None, LIMITS)
    try:
        companion.future.result(timeout=120)  # started (the first also starts the fork server)
        time.sleep(1.0)  # the task loads in the child meanwhile
        started = time.monotonic()
        assert companion.channel() is not None, companion.status
        assert companion.status == "handed to the child" and time.monotonic() - started < 0.5
    finally:
        companion.future.result().close()


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
    assert loaded["type"] == "loaded" and loaded["tampered"] == [], loaded  # ours is no tamper
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
    found in the child's cache; the verdicts are those without one. More evaluations than
    spares: children started after the first reference was compiled (torch's compiler then
    names its own ptxas in this process's environment) still assemble as their companion does."""
    evaluator = Evaluator(EvalConfig(device="cuda", compile_ahead=True, spare_children=2))
    try:
        for task, solution in bundled_pairs("triton")[:4]:
            result = evaluator.evaluate(task, solution)
            assert result.status is Status.CORRECT, (task.id, result.error)
            record = result.sandbox["compile_ahead"]
            assert record["companion"] == "handed to the child", record
            assert record.get("found", 0) >= 1 and record.get("compiled_here", 0) == 0, record
            assert result.phase_seconds["child_compile_ahead"] > 0
    finally:
        evaluator.close()
