"""The backend registry: one object per kernel language, and everything that asks for one."""

from __future__ import annotations

import pytest

from kernelrl.env.backends import BACKENDS, get_backend, solution_kernel_names
from kernelrl.env.integrity.static_checks import run_static_checks
from kernelrl.env.task import Task, TaskError
from kernelrl.prompts import _HOW, EXAMPLE_REFERENCE, EXAMPLE_SOLUTIONS, prompt_builders


@pytest.mark.parametrize("name", list(BACKENDS))
def test_every_backend_has_a_prompt_and_a_one_shot_that_passes_its_own_checks(name: str) -> None:
    backend = get_backend(name)
    assert name in _HOW and name in EXAMPLE_SOLUTIONS
    solution = EXAMPLE_SOLUTIONS[name]
    assert run_static_checks(solution, name, EXAMPLE_REFERENCE) == []
    assert solution_kernel_names(solution, name)  # the profiler has names to look for
    prompt = prompt_builders()[name].render(EXAMPLE_REFERENCE)
    assert backend.display_name in str(prompt)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_solution_in_another_backend_is_refused_as_another_compiler(name: str) -> None:
    for other in BACKENDS:
        if other == name:
            continue
        failures = run_static_checks(EXAMPLE_SOLUTIONS[other], name, EXAMPLE_REFERENCE)
        assert "other_compiler" in {f.name for f in failures}, failures


def test_an_unknown_backend_is_a_clear_error_everywhere() -> None:
    with pytest.raises(ValueError, match="backend must be one of triton, cuda, got 'tilelang'"):
        get_backend("tilelang")
    with pytest.raises(TaskError, match="task t: backend must be one of"):
        Task(id="t", source="", backend="tilelang")
    with pytest.raises(ValueError, match="backend must be one of"):
        run_static_checks(EXAMPLE_SOLUTIONS["triton"], "tilelang")
