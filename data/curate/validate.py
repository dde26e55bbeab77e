"""Validate task references by running them, sandboxed, through the environment's machinery.

Why a sandboxed child and not the evaluator: inside the environment a reference is trusted
(it comes from our task suite) and runs in the worker process. A record of a corpus being
curated is not trusted yet; running it in the curation process would let any record read
files, open sockets or crash the run. The evaluator cannot run a reference for us either: it
computes references in its own process, and the task's ``Model`` posing as a solution would
fail the static checks ("no custom kernel"), which exist for solutions, not references.

So this step talks to the environment's sandbox directly: each reference runs twice, each time
in a fresh sandboxed child (``reference_probe``), and the two runs are judged together
(``verdict``: what makes a reference usable). A pair of runs that fails for a reason that may be
ours (a harness error, or out of memory beside other runs) is run once more alone, and a
harness error that persists is reported, never journaled, so a rerun tries it again.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from datasets import Dataset
from rich.console import Console

from kernelrl.data.curate.reference_probe import Probe, ReferenceProber
from kernelrl.data.curate.report import StepReport, log_step, step_progress, timed
from kernelrl.data.curate.resume import Journal
from kernelrl.data.curate.validate_config import ValidateConfig
from kernelrl.data.curate.verdict import outcome, seeds_for
from kernelrl.data.schema import make_dataset
from kernelrl.env.task import Task, task_from_row


def validate_tasks(
    tasks: Dataset,
    config: ValidateConfig | None = None,
    console: Console | None = None,
    journal: Journal | None = None,
    *,
    device: str = "auto",
    seed: int = 0,
) -> tuple[Dataset, StepReport]:
    """Keep the tasks whose references pass (``verdict``); add runtime and ops. The runs are on
    ``device`` (cpu, cuda or auto), their model and input seeds derive from ``seed`` and each
    task's content, so reruns validate identically.

    With a ``journal`` (``resume.Journal`` keyed by ``verdict_settings``), each task's verdict is
    appended as soon as both of its runs are judged, and tasks already in the journal are not
    run again: an interrupted validation resumes where it stopped. Progress goes to
    ``console`` as a bar, one step per task.
    """
    config = config or ValidateConfig()
    report = StepReport("validate", count_in=len(tasks))
    rows = list(tasks)
    task_list = [task_from_row(row) for row in rows]
    verdicts: dict[int, dict[str, Any]] = {}
    for index, task in enumerate(task_list):
        entry = journal.get(task.hash) if journal is not None else None
        if entry is not None:
            verdicts[index] = entry
    todo = [i for i in range(len(rows)) if i not in verdicts]
    seeds = {i: seeds_for(task_list[i], seed, config.num_input_sets) for i in todo}
    if verdicts:
        report.notes["resumed_from_journal"] = len(verdicts)
    with (
        timed(report),
        ReferenceProber(config, device) as prober,
        step_progress(console, "validate", len(rows), completed=len(verdicts)) as progress,
    ):

        def judged(index: int, verdict: dict[str, Any]) -> None:
            verdicts[index] = verdict
            if journal is not None and verdict.get("reason") != "harness_error":
                journal.add(task_list[index].hash, rows[index]["id"], verdict)
            progress.advance()

        runs = _PairedRuns(prober, config, task_list, seeds)
        runs.run(todo, judged)
        if runs.rerun_alone:
            report.notes["rerun_alone"] = len(runs.rerun_alone)
        report.notes["device"] = prober.device_name
    result = make_dataset(_kept_rows(rows, verdicts, report), "tasks")
    report.count_out = len(result)
    log_step(report, console)
    return result, report


class _PairedRuns:
    """Both runs of every reference, on a pool of threads that each wait for a sandboxed
    child; a pair that failed for a reason that may be ours (``_ours``) runs once more, alone.
    """

    def __init__(
        self,
        prober: ReferenceProber,
        config: ValidateConfig,
        task_list: list[Task],
        seeds: dict[int, tuple[int, list[int]]],
    ) -> None:
        self.prober = prober
        self.config = config
        self.task_list = task_list
        self.seeds = seeds
        self.rerun_alone: set[int] = set()
        self._pending: dict[Future[Probe], tuple[int, int]] = {}
        self._probes: dict[int, list[Probe | None]] = {}
        self._executor = ThreadPoolExecutor(max_workers=max(config.validate_workers, 1))

    def run(self, todo: list[int], judged: Callable[[int, dict[str, Any]], None]) -> None:
        """Run the pairs of ``todo``; ``judged(index, verdict)`` as each pair is judged."""
        try:
            for index in todo:
                self._submit(index, alone=False)
            while self._pending:
                done, _ = wait(self._pending, return_when=FIRST_COMPLETED)
                for future in done:
                    verdict = self._collect(future)
                    if verdict is not None:
                        judged(*verdict)
        except BaseException:
            # Ctrl-C (or a failure of ours): runs not started are cancelled, runs in flight are
            # killed; verdicts already journaled are kept.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self.prober.interrupt()
            raise
        finally:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _submit(self, index: int, alone: bool) -> None:
        task = self.task_list[index]
        model_seed, input_seeds = self.seeds[index]
        self._probes[index] = [None, None]
        # The second run repeats every input set but skips timing and the profiled call
        # (seconds on CPU). All of them: a reference drawing one of 64 channels from an
        # unseeded RNG agreed with itself on one input set in 1 of 64 validations.
        for which, time_it in ((0, True), (1, False)):
            future = self._executor.submit(
                self.prober.run, task, model_seed, input_seeds, time_it, alone
            )
            self._pending[future] = (index, which)

    def _collect(self, future: Future[Probe]) -> tuple[int, dict[str, Any]] | None:
        """The verdict of the pair ``future`` completes, or None while the pair is unfinished
        or is being run again alone."""
        index, which = self._pending.pop(future)
        self._probes[index][which] = future.result()
        first, second = self._probes[index]
        if first is None or second is None:
            return None
        if index not in self.rerun_alone and _ours(first, second, self.prober.kind):
            # Our failure, or out of memory beside other runs: once more, alone.
            self.rerun_alone.add(index)
            self._submit(index, alone=True)
            return None
        del self._probes[index]
        task = self.task_list[index]
        return index, outcome(task, first, second, self.seeds[index], self.config, self.prober)


def _kept_rows(
    rows: list[dict[str, Any]], verdicts: dict[int, dict[str, Any]], report: StepReport
) -> list[dict[str, Any]]:
    """The rows whose reference passed, with the verdict's fields; the others are removed in
    ``report`` with their reason."""
    kept: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        verdict = verdicts[index]
        if verdict.get("reason"):
            report.remove(row["id"], verdict["reason"], verdict.get("detail", ""))
        else:
            kept.append({**row, "validated": True, **verdict["fields"]})
    return kept


def _ours(first: Probe, second: Probe, kind: str) -> bool:
    """Whether a failed pair of runs may not be the reference's fault: a harness error, or a
    GPU out-of-memory error while other runs shared the device."""
    for probe in (first, second):
        if probe.failure == "harness_error":
            return True
        if kind == "cuda" and probe.out_of_memory:
            return True
    return False
