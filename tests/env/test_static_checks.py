"""Every static check catches its hacking solutions and passes the legitimate near-misses.

Corpus: ``tests/solutions/static/<check>__<what>.py`` must fail ``<check>``;
``pass__<what>.py`` must pass every check. A header line ``# task: <id>`` picks the bundled task
(default ``01_relu``) and ``# backend: cuda`` the backend (default triton).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelrl.data.bundled import TASKS_DIR, bundled_pairs
from kernelrl.env.evaluator import EvalConfig, Evaluator
from kernelrl.env.integrity.static_checks import STATIC_CHECKS, run_static_checks
from kernelrl.env.result import Status
from kernelrl.env.task import load_task

CORPUS = Path(__file__).parents[1] / "solutions" / "static"
HACKS = sorted(p for p in CORPUS.glob("*.py") if not p.name.startswith("pass__"))
LEGIT = sorted(CORPUS.glob("pass__*.py"))


def _header(source: str, key: str, default: str) -> str:
    match = re.search(rf"^# {key}: (\S+)", source, re.M)
    return match.group(1) if match else default


def _check(path: Path) -> list:
    source = path.read_text()
    task = load_task(TASKS_DIR / f"{_header(source, 'task', '01_relu')}.py")
    return run_static_checks(source, _header(source, "backend", "triton"), task.source)


@pytest.mark.parametrize("path", HACKS, ids=lambda p: p.stem)
def test_hack_is_caught_by_its_check(path: Path) -> None:
    expected = path.stem.split("__")[0]
    names = {failure.name for failure in _check(path)}
    assert expected in names, f"{path.name}: expected {expected}, got {sorted(names)}"


@pytest.mark.parametrize("path", LEGIT, ids=lambda p: p.stem)
def test_legitimate_near_miss_passes(path: Path) -> None:
    assert [str(f) for f in _check(path)] == []


def test_every_check_has_a_hack_and_the_corpus_names_only_real_checks() -> None:
    named = {p.stem.split("__")[0] for p in HACKS}
    assert named == set(STATIC_CHECKS)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_bundled_solutions_pass_every_check(backend: str) -> None:
    pairs = bundled_pairs(backend)
    assert pairs
    for task, solution in pairs:
        assert run_static_checks(solution, backend, task.source) == [], task.id


def test_failures_carry_line_numbers_and_messages() -> None:
    failures = _check(CORPUS / "torch_fallback__matmul_call.py")
    matmul = [f for f in failures if f.name == "torch_fallback"]
    assert matmul and matmul[0].lineno and "matmul" in matmul[0].message


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError, match="backend"):
        run_static_checks("x = 1", "opencl")


def test_evaluator_reports_integrity_violation_without_running_anything() -> None:
    evaluator = Evaluator(EvalConfig(device="cpu", spare_children=0))
    try:
        task = load_task(TASKS_DIR / "01_relu.py")
        completion = (
            "Here:\n```python\n" + (CORPUS / "monkeypatch__allclose.py").read_text() + "```\n"
        )
        result = evaluator.evaluate(task, completion)
    finally:
        evaluator.close()
    assert result.status == Status.INTEGRITY_VIOLATION
    assert result.checks_failed == ["monkeypatch"]
    assert "monkeypatch" in result.feedback and result.phase_seconds.get("child_wait") is None


def test_a_mistaken_api_is_a_compile_error_not_a_hack() -> None:
    source = (CORPUS / "pass__constexpr_global.py").read_text()
    mistaken = source.replace("x.numel()", "x.element_count()", 1)
    assert mistaken != source
    assert {f.name for f in run_static_checks(mistaken, "triton")} == {"unknown_api"}
    evaluator = Evaluator(EvalConfig(device="cpu", spare_children=0))
    try:
        task = load_task(TASKS_DIR / "01_relu.py")
        result = evaluator.evaluate(task, f"```python\n{mistaken}```\n")
    finally:
        evaluator.close()
    assert result.status is Status.COMPILE_ERROR and "element_count" in result.error


def test_an_undefined_name_is_a_compile_error_not_a_hack() -> None:
    """A name neither bound nor a builtin fails as Python would (a NameError), and costs the
    solution an honest failure's score, not a hack's; what could bind it dynamically still
    makes the verdict a violation, and dunder names stay references to be judged."""
    source = (CORPUS / "pass__constexpr_global.py").read_text()
    mistaken = source.replace("tl.load(x_ptr + offs, mask=mask), 0.0)", "tl.load(x1 + offs), 0.0)")
    assert mistaken != source
    failures = run_static_checks(mistaken, "triton")
    assert {f.name for f in failures} == {"undefined_name"} and "'x1'" in failures[0].message
    bound_elsewhere = mistaken + "\nglobals()['x1'] = None\n"
    assert "forbidden_builtin" in {f.name for f in run_static_checks(bound_elsewhere, "triton")}
    dunder = source + "\nLOADER = __loader__\n"
    assert "unlisted_reference" in {f.name for f in run_static_checks(dunder, "triton")}
    evaluator = Evaluator(EvalConfig(device="cpu", spare_children=0))
    try:
        task = load_task(TASKS_DIR / "01_relu.py")
        result = evaluator.evaluate(task, f"```python\n{mistaken}```\n")
        hack = evaluator.evaluate(task, f"```python\n{bound_elsewhere}```\n")
    finally:
        evaluator.close()
    assert result.status is Status.COMPILE_ERROR and "NameError" in result.error
    assert hack.status is Status.INTEGRITY_VIOLATION


def test_global_state_is_refused_as_what_it_is() -> None:
    failures = _check(CORPUS / "global_state__set_default_dtype.py")
    assert [f.name for f in failures] == ["global_state"]
    assert "torch.set_default_dtype" in failures[0].message
    assert "process-wide state" in failures[0].message
    tensor_set = (
        (CORPUS / "pass__set_printoptions.py")
        .read_text()
        .replace("        return out", "        out.set_(out)\n        return out")
    )
    names = {f.name for f in run_static_checks(tensor_set, "triton")}
    assert "global_state" not in names  # a tensor's own set_ is no global setter


def test_host_compute_names_what_reads_the_device_from_the_host() -> None:
    failures = _check(CORPUS / "host_compute__memcpy_device_to_host.py")
    assert [f.name for f in failures] == ["host_compute"]
    assert "cudaMemcpyDeviceToHost" in failures[0].message
    numeric = _check(CORPUS / "host_compute__numeric_copy_kind.py")
    assert "without a named host-to-device direction" in numeric[0].message


def test_a_plan_holding_an_output_stays_caching_while_one_of_shapes_passes() -> None:
    caching = _check(CORPUS / "output_caching__plan_holding_output.py")
    assert {f.name for f in caching} == {"output_caching"}
    assert _check(CORPUS / "pass__plan_object_from_shapes.py") == []


def test_folding_a_string_never_builds_a_huge_one() -> None:
    """Constant folding runs on the trusted side over source a model wrote: a format width or a
    chain of doublings must not make the worker build gigabytes."""
    import time
    import tracemalloc

    from kernelrl.env.integrity.names import MAX_FOLDED_CHARS

    doublings = "\n".join(f"s{i + 1} = s{i} + s{i}" for i in range(40))
    relu = Path(__file__).parents[2] / "data" / "solutions" / "triton" / "01_relu.py"
    source = (
        relu.read_text()
        + '\nWIDE = "{:>400000000}".format("x")\nTIMES = "ab" * 10**9\n'
        + 's0 = "abcd"\n'
        + doublings
        + '\nGROWN = ("a" * 4000).replace("a", "bbbbbbbbbb")\n'
    )
    tracemalloc.start()
    started = time.perf_counter()
    run_static_checks(source, "triton", load_task(TASKS_DIR / "01_relu.py").source)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.perf_counter() - started < 30
    assert peak < 200 * 2**20, f"static checks peaked at {peak / 2**20:.0f} MiB"
    assert MAX_FOLDED_CHARS <= 2**16
