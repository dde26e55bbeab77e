"""Reference validation in the environment's sandbox: every way a reference can be unusable."""

from __future__ import annotations

import contextlib
import json
import socket
from dataclasses import asdict
from pathlib import Path

import pytest

from kernelrl.data.curate.normalize import normalize_tasks
from kernelrl.data.curate.reference_probe import Probe, ReferenceProber
from kernelrl.data.curate.validate import ValidateConfig, _ours, validate_tasks
from kernelrl.data.curate.verdict import seeds_for
from kernelrl.data.schema import make_dataset
from kernelrl.env.admission import GpuMemoryBudget, plan_for
from kernelrl.env.task import task_from_source
from kernelrl.env.timing import PROCEDURE, TimingConfig

GIB = 2**30

RAW = Path(__file__).parents[1] / "fixtures" / "curate" / "raw_tasks"
GELU = (RAW / "01_gelu_tanh.py").read_text()

TEMPLATE = """
import torch
import torch.nn as nn
{imports}

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
{body}


def get_inputs():
    return [torch.randn(4, 33)]


def get_init_inputs():
    return []
"""


def reference(body: str, imports: str = "") -> str:
    return TEMPLATE.format(
        imports=imports, body="\n".join("        " + line for line in body.splitlines())
    )


@pytest.fixture(scope="module")
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def validated(listener, tmp_path_factory):
    marker = tmp_path_factory.mktemp("hostile") / "pid.txt"
    port = listener.getsockname()[1]
    hostile = reference(
        "return x * 2",
        imports=(
            "import os, socket\n"
            "try:\n"
            f"    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
            "except OSError:\n"
            "    pass\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'stolen')\n"
        ),
    )
    records = {
        "good_gelu": GELU,
        "crashes": (RAW / "04_crashing_reference.py").read_text(),
        "nan_outputs": (RAW / "06_log_of_inputs.py").read_text(),
        "nondeterministic": (RAW / "07_random_channel_drop.py").read_text(),
        "constant": reference("return torch.ones_like(x)"),
        "mutates_input": reference("x.mul_(2.0)\nreturn x.sum(dim=1)"),
        "import_error": reference("return x", imports="import a_module_that_does_not_exist"),
        "hangs": reference("while True:\n    pass"),
        "hostile": hostile,
    }
    rows = [{"id": key, "source": source, "origin": "test"} for key, source in records.items()]
    tasks, _ = normalize_tasks(make_dataset(rows, "tasks"))
    config = ValidateConfig(validate_timeout_s=12, validate_workers=2)
    kept, report = validate_tasks(tasks, config, device="cpu")
    return kept, {r.id: r for r in report.removed}, marker


def test_good_reference_is_kept_with_runtime_and_ops(validated) -> None:
    kept, _, _ = validated
    assert kept["id"] == ["good_gelu"]
    row = kept[0]
    assert row["validated"] is True and row["ref_runtime_ms"] > 0
    assert row["aten_ops"] == ["aten::gelu"]
    details = json.loads(row["validation"])
    assert details["runs"] == 2 and details["max_abs_diff_between_runs"] == 0.0
    assert details["device"] == "cpu"


@pytest.mark.parametrize(
    ("record", "reason", "detail"),
    [
        ("crashes", "reference_crashes", "shapes cannot be multiplied"),
        ("nan_outputs", "non_finite_output", "NaN or Inf"),
        ("nondeterministic", "nondeterministic", "two runs with equal seeds disagree"),
        ("constant", "constant_output", "does not depend on the inputs"),
        ("mutates_input", "mutates_inputs", "changed its inputs"),
        ("import_error", "reference_does_not_load", "a_module_that_does_not_exist"),
        ("hangs", "reference_timeout", "time limit"),
        ("hostile", "reference_does_not_load", "Network is unreachable"),
    ],
)
def test_bad_reference_is_removed_with_reason(
    validated, record: str, reason: str, detail: str
) -> None:
    _, removed, _ = validated
    assert removed[record].reason == reason
    assert detail in removed[record].detail


def test_records_run_in_a_sandboxed_child_without_network(validated, listener) -> None:
    """The untrusted record ran confined: its file write did not reach this machine's /tmp
    (the sandbox's /tmp is private, the rest read-only) and its connection went nowhere."""
    _, removed, marker = validated
    assert "Network is unreachable" in removed["hostile"].detail  # it did run, in the sandbox
    assert not marker.exists()
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_runtime_budget() -> None:
    tasks, _ = normalize_tasks(make_dataset([{"id": "gelu", "source": GELU}], "tasks"))
    kept, report = validate_tasks(
        tasks, ValidateConfig(max_ref_runtime_ms=1e-6, validate_workers=2), device="cpu"
    )
    assert len(kept) == 0
    assert (
        report.removed[0].reason == "too_slow" and "exceeds the budget" in report.removed[0].detail
    )


class RecordingBudget(GpuMemoryBudget):
    """A real budget that remembers what each run asked to reserve."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.asked: list[int] = []

    def reserve(self, nbytes: int, context=None):  # type: ignore[override]
        self.asked.append(nbytes)
        return super().reserve(nbytes, context)


def test_runs_start_once_the_footprint_the_sandbox_measured_is_reserved() -> None:
    """The untrusted record's footprint is measured in the sandbox (meta device) and reserved
    before its tensors exist; a run that must be alone reserves the whole budget; a record whose
    footprint cannot be measured is admitted alone too."""
    config = ValidateConfig(validate_timeout_s=30, validate_workers=1)
    good = task_from_source(reference("return x * 2"), "double")
    unmeasurable = task_from_source(
        reference("return x * 2").replace(
            "return [torch.randn(4, 33)]",
            "return [torch.randn(4, 33)] if torch.randn(1).device.type != 'meta' else 1 / 0",
        ),
        "unmeasurable",
    )
    with ReferenceProber(config, "cpu") as prober:
        budget = RecordingBudget(64 * GIB)
        prober.gpu_budget = budget
        model_seed, seeds = seeds_for(good, 0, config.num_input_sets)
        shared = prober.run(good, model_seed, seeds, time_it=False)
        alone = prober.run(good, model_seed, seeds, time_it=False, alone=True)
        odd = prober.run(
            unmeasurable, *seeds_for(unmeasurable, 0, config.num_input_sets), time_it=False
        )
        with contextlib.ExitStack() as held:
            context = held.callback(budget.hold_context())
            large = prober._admit(
                held,
                False,
                context,
                {"input_bytes": 8 * GIB, "param_bytes": 0, "output_bytes": 0},
            )
    timing = config.timing
    assert large == {"bytes": plan_for(8 * GIB, 0, 0, timing).child_bytes, "timing_placements": 1}
    assert shared.failure is None and alone.failure is None and odd.failure is None
    tensor = 4 * 33 * 4
    expected = plan_for(tensor, 0, tensor, timing).child_bytes
    largest = plan_for(8 * GIB, 0, 0, timing).child_bytes
    assert budget.asked == [expected, 64 * GIB, 64 * GIB, largest]
    # Each run's child held its context from its start, taken over by its admission.
    assert budget.reserved == 0 and budget.in_flight == 0 and budget.contexts_waiting == 0


def test_failures_that_may_be_ours_are_run_again_alone() -> None:
    oom = Probe(
        failure="reference_crashes", detail="ory. Tried to allocate 8 GiB", out_of_memory=True
    )
    ok = Probe()
    assert _ours(Probe(failure="harness_error"), ok, "cpu")
    assert _ours(ok, oom, "cuda")
    assert not _ours(ok, oom, "cpu")
    assert not _ours(Probe(failure="reference_crashes", detail="ZeroDivisionError"), ok, "cuda")


def test_the_journal_key_ignores_the_number_of_workers() -> None:
    """A rerun with more workers resumes; a rerun that would judge differently does not."""
    key = ValidateConfig(validate_workers=2).verdict_settings("auto", 0)
    assert key == ValidateConfig(validate_workers=8).verdict_settings("auto", 0)
    assert key != ValidateConfig(validate_workers=2).verdict_settings("auto", 1)
    assert key != ValidateConfig(validate_timeout_s=60).verdict_settings("auto", 0)
    assert key != ValidateConfig().verdict_settings("cpu", 0)


def test_the_journal_key_keeps_the_names_journals_were_written_with() -> None:
    """The step's recipe keys (validate_timeout_s, max_ref_runtime_ms) are not the names the
    journal's key has always used; those names stay, or every earlier journal is orphaned."""
    key = ValidateConfig(validate_timeout_s=12, max_ref_runtime_ms=5).verdict_settings("cpu", 3)
    assert key == {
        "device": "cpu",
        "gpu_index": 0,
        "timeout_s": 12,
        "max_runtime_ms": 5,
        "num_input_sets": 2,
        "seed": 3,
        "host_memory_bytes": 8 * GIB,
        "reject_constant_outputs": True,
        "timing": {**asdict(TimingConfig()), "procedure": PROCEDURE},
    }
