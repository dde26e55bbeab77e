"""The sweep loop: prompts -> generation -> environment -> samples.jsonl, turn by turn.

Generation and evaluation overlap: a batch of completions is handed to the pool (which returns
futures at once) and the next batch is generated while the pool works; each result is written
to ``samples.jsonl`` the moment it arrives. Turn t+1 of a sample needs the feedback of its turn
t, so turns are sequential: every evaluation of turn t finishes before turn t+1 starts.

Resuming: the store is read first and every (task, sample, turn) already there is skipped, so
a killed sweep restarts where it stopped; a ``harness_error`` attempt (kernelrl failed, not the
solution) is not kept as done: resuming evaluates it again. The folder's ``config.json``
records the settings that define the samples; resuming with different ones is refused (their
samples would not be comparable), ``overwrite`` starts over.

Every selected task is written to ``tasks.json`` with its planned samples, and with a reason
where it gets no evaluated attempt (``no solution``: the fixed client has none;
``not evaluated: <error>``: the pool failed on it). Reports count these tasks as failed in every
denominator and list them; a task is never dropped silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from kernelrl.env.pools import Pool
from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task
from kernelrl.eval.clients import Generation, GenerationClient, Request
from kernelrl.eval.config import EvalSweepConfig
from kernelrl.eval.records import (
    CONFIG_FILE,
    NO_SOLUTION,
    SAMPLES_FILE,
    TASKS_FILE,
    Key,
    SampleRecord,
    SamplesFile,
    SelectedTask,
    write_atomic,
    write_fix,
    write_tasks,
)
from kernelrl.progress import Progress
from kernelrl.prompts import SYSTEM, PromptBuilder

OUTPUT_FILES = (SAMPLES_FILE, CONFIG_FILE, TASKS_FILE, "summary.json", "report.md")


def sample_seed(base: int, task_id: str, sample: int, turn: int) -> int:
    digest = hashlib.sha256(f"{base}:{task_id}:{sample}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def check_resumable(config: EvalSweepConfig) -> None:
    """Refuse to add samples to a folder whose sweep was made with different settings."""
    folder = Path(config.output_dir)
    config_path = folder / CONFIG_FILE
    if config.overwrite or not (config_path.exists() and (folder / SAMPLES_FILE).exists()):
        return
    previous = json.loads(config_path.read_text())
    # A folder written before the pool keys were renamed holds their old names.
    renamed = EvalSweepConfig.RENAMED_KEYS
    previous = {renamed.get(key, key): value for key, value in previous.items()}
    identity = config.identity()
    changed = sorted(k for k in identity if previous.get(k) != identity[k])
    if changed:
        raise ValueError(
            f"{folder} holds a sweep made with different {', '.join(changed)}; "
            "use another output_dir, or overwrite: true to start over"
        )


class SweepStopped(Exception):
    """The sweep stopped before its plan was done: Ctrl-C, or results that could not be written
    (a full disk). The message is one line: what was kept, what was lost, how to resume."""

    def __init__(self, message: str, interrupted: bool) -> None:
        super().__init__(message)
        self.interrupted = interrupted


def prepare_output(config: EvalSweepConfig) -> Path:
    """Create or reopen the results folder (``overwrite`` empties it first)."""
    check_resumable(config)
    folder = Path(config.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    if config.overwrite:
        for name in OUTPUT_FILES:
            (folder / name).unlink(missing_ok=True)
        for plot in (folder / "plots").glob("*.png"):
            plot.unlink()
    write_atomic(
        folder / CONFIG_FILE, json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n"
    )
    return folder


@dataclass
class SweepOutcome:
    records: list[SampleRecord]
    folder: Path
    new_records: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Sweep:
    def __init__(
        self,
        config: EvalSweepConfig,
        tasks: Sequence[Task],
        client: GenerationClient | None,
        pool: Pool,
        console: Console | None = None,
    ) -> None:
        self.config = config
        self.tasks = list(tasks)
        self.client = client
        self.pool = pool
        self.console = console or Console(stderr=True)
        self.prompts = PromptBuilder.from_file(
            config.prompt_template,
            backend=config.backend,
            one_shot=config.one_shot,
            system_prompt=SYSTEM if config.system_prompt == "default" else config.system_prompt,
            history_turns=config.history_turns,
            feedback_template=config.feedback_template,
        )
        samples_for = getattr(client, "samples_for", None)
        self.samples = {
            t.id: (samples_for(t.id) if callable(samples_for) else config.samples)
            for t in self.tasks
        }
        self.selected = list(self.tasks)  # every task counts in the report, attempts or not
        self.skipped_tasks = [t.id for t in self.tasks if self.samples[t.id] == 0]
        self.tasks = [t for t in self.tasks if self.samples[t.id] > 0]
        self._lock = threading.Lock()
        self.records: dict[Key, SampleRecord] = {}
        self.failures: list[str] = []
        self.not_evaluated: dict[str, str] = {}  # task id -> the pool's error (first one)
        self.new = 0  # records written by this run
        self.lost = 0  # evaluated attempts whose record could not be written
        self.write_error: OSError | None = None  # the first such error (a full disk)
        self._submitted: list[Future[EvalResult]] = []  # pool futures, cancelled on a stop
        self._written: list[Future[None]] = []  # one per submitted: resolved once recorded

    def selection(self) -> list[SelectedTask]:
        """The selected tasks for ``tasks.json``, with why a task has no evaluated attempt."""
        scored = {k[0] for k, r in self.records.items() if r.result.scored}
        rows = []
        for task in self.selected:
            reason = ""
            if self.samples[task.id] == 0:
                reason = NO_SOLUTION
            elif task.id in self.not_evaluated and task.id not in scored:
                reason = f"not evaluated: {self.not_evaluated[task.id]}"
            rows.append(
                SelectedTask(task.id, task.level, task.category, self.samples[task.id], reason)
            )
        return rows

    def _load_done(self, store: SamplesFile) -> dict[Key, SampleRecord]:
        """Attempts already in the store for these tasks; harness errors are done again."""
        known = {t.id for t in self.tasks}
        return {k: r for k, r in store.load().items() if k[0] in known and r.result.scored}

    # ------------------------------------------------------------------ planning
    def _wants(self, task: Task, sample: int, turn: int) -> bool:
        """Whether (task, sample, turn) should be generated now (and is not done)."""
        if (task.id, sample, turn) in self.records:
            return False
        if turn > 0:
            previous = self.records.get((task.id, sample, turn - 1))
            if previous is None:
                return False  # the sample ended earlier (or its evaluation failed)
            if self.config.stop_when_correct and previous.result.correct:
                return False
        return self.client is None or self.client.available(task.id, sample, turn)

    def _history(self, task: Task, sample: int, turn: int) -> list[tuple[str, str]]:
        attempts = []
        for t in range(turn):
            record = self.records.get((task.id, sample, t))
            if record is not None:  # present unless someone edited the store by hand
                attempts.append((record.completion, record.result.feedback))
        return attempts

    def _planned(self, next_turn: int = 0) -> int:
        """Attempts still expected, counting future turns of live samples (an upper bound).
        Turns before ``next_turn`` are finished: an attempt missing there ended its sample."""
        total = 0
        for task in self.tasks:
            for sample in range(self.samples[task.id]):
                for turn in range(self.config.max_turns):
                    key = (task.id, sample, turn)
                    if key in self.records:
                        continue
                    if turn < next_turn:
                        break
                    previous = self.records.get((task.id, sample, turn - 1)) if turn else None
                    if (
                        previous is not None
                        and self.config.stop_when_correct
                        and previous.result.correct
                    ):
                        break
                    if not self.client.available(task.id, sample, turn):
                        break
                    total += 1
        return total

    def pending(self) -> int:
        """Attempts a run would generate now, from the results folder alone (no model needed):
        a resumed sweep that is complete does not start an inference engine for nothing."""
        check_resumable(self.config)
        samples = Path(self.config.output_dir) / SAMPLES_FILE
        if self.config.overwrite or not samples.exists():
            self.records = {}
        else:
            self.records = self._load_done(SamplesFile(samples))
        return sum(
            self._wants(task, sample, turn)
            for turn in range(self.config.max_turns)
            for task in self.tasks
            for sample in range(self.samples[task.id])
        )

    # ------------------------------------------------------------------ running
    def run(self) -> SweepOutcome:
        """Run what is left of the plan. Ctrl-C or a write error (a full disk) cancels the
        evaluations not yet started, lets the running ones finish and be written, and raises
        ``SweepStopped`` saying what is kept; the same command resumes."""
        started = time.perf_counter()
        try:
            return self._run(started)
        except KeyboardInterrupt:
            cancelled = self._stop()
            raise SweepStopped(self._stopped_message(cancelled, "interrupted"), True) from None
        except _WriteFailed:  # samples.jsonl, config.json or tasks.json refused a write
            cancelled = self._stop()
            raise SweepStopped(self._stopped_message(cancelled, "stopped"), False) from None
        except Exception:
            # Not a write error (e.g. EndpointUnreachable, itself an OSError): the caller names
            # its own cause; the queued evaluations stop and the running ones are written.
            self._stop()
            raise

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """An OSError here is the results folder refusing a write (a full disk, no permission),
        told apart from the OSErrors of generation (a dead endpoint is a ConnectionError)."""
        try:
            yield
        except OSError as exc:
            self.write_error = self.write_error or exc
            raise _WriteFailed from exc

    def _stop(self) -> int:
        """Cancel every evaluation not started yet; wait for the running ones (their records
        are written). Returns how many were cancelled."""
        cancelled = sum(future.cancel() for future in self._submitted)
        # Wait for the records, not the pool futures: a pool future is done before its callback
        # has written the record (a cancelled one's callback ran inside cancel()).
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: stop waiting
            wait(self._written)
        return cancelled

    def _stopped_message(self, cancelled: int, how: str) -> str:
        store = Path(self.config.output_dir) / SAMPLES_FILE
        saved = len(self.records)
        kept = (
            f"{saved} attempt{'s are' if saved != 1 else ' is'} saved in {store} ({self.new} new)"
        )
        skipped = f"{cancelled} queued evaluation{'s' if cancelled != 1 else ''} cancelled"
        if self.write_error is not None:
            error = self.write_error
            cause = f"cannot write {error.filename or store}: {error.strerror or error}"
            lost = (  # none when config.json or tasks.json was the write that failed
                f"{self.lost} evaluated attempt{'s' if self.lost != 1 else ''} could not be saved "
                "and will be evaluated again; "
                if self.lost
                else ""
            )
            fix = write_fix(error, self.config.output_dir)
            return (
                f"{cause}; {lost}{kept}; {skipped}; {fix} and run the same command "
                "again to resume (summary.json and report.md were left as they were)"
            )
        return f"{how}: {kept}; {skipped}; run the same command again to resume"

    def _run(self, started: float) -> SweepOutcome:
        with self._writing():
            folder = prepare_output(self.config)
            store = SamplesFile(folder / SAMPLES_FILE)
            store.path.touch()  # a results folder even if no task gets an attempt
        self.records = self._load_done(store)
        with self._writing():
            write_tasks(folder / TASKS_FILE, self.selection())
        resumed = len(self.records)
        if resumed:
            self.console.print(
                f"resuming {folder}: {resumed} attempts already done", soft_wrap=True
            )
        if self.skipped_tasks:
            self.console.print(
                f"[yellow]{len(self.skipped_tasks)} of {len(self.selected)} tasks have no fixed "
                f"solution: they count as failed ('{NO_SOLUTION}')[/yellow]: "
                f"{', '.join(self.skipped_tasks[:8])}"
                + (" ..." if len(self.skipped_tasks) > 8 else ""),
                soft_wrap=True,
                markup=True,
            )
        self.new = 0
        # A bar on a terminal; periodic plain lines in a log file (kernelrl.progress).
        with Progress(self.console) as progress:
            planned = self._planned()
            generate_bar = progress.add_task("generate", total=planned)
            evaluate_bar = progress.add_task("evaluate", total=planned)
            for turn in range(self.config.max_turns):
                pending = [
                    (task, sample)
                    for task in self.tasks
                    for sample in range(self.samples[task.id])
                    if self._wants(task, sample, turn)
                ]
                if not pending:
                    continue
                progress.update(generate_bar, description=f"generate (turn {turn + 1})")
                progress.update(evaluate_bar, description=f"evaluate (turn {turn + 1})")
                futures: list[Future[None]] = []
                batch_size = max(1, self.config.generation_batch)
                for start in range(0, len(pending), batch_size):
                    batch = pending[start : start + batch_size]
                    self._check_written()
                    submitted = self._generate_and_submit(
                        batch, turn, store, progress, evaluate_bar
                    )
                    progress.advance(generate_bar, len(batch))
                    if not self.config.overlap:
                        wait(submitted)  # the GPU is quiet while kernels are timed
                    futures.extend(submitted)
                self._wait_written(futures)
                self._check_written()
                # Future turns of samples that stopped (correct, or no fixed completion) shrink
                # the plan; keep the bars honest.
                remaining = self._planned(turn + 1)
                for bar in (generate_bar, evaluate_bar):
                    done = progress.completed(bar)
                    progress.update(bar, total=done + remaining)
        with self._writing():
            write_tasks(folder / TASKS_FILE, self.selection())
        records = sorted(self.records.values(), key=lambda r: (r.task_id, r.sample, r.turn))
        return SweepOutcome(records, folder, self.new, self.failures, time.perf_counter() - started)

    def _check_written(self) -> None:
        if self.write_error is not None:
            raise _WriteFailed

    def _wait_written(self, futures: Sequence[Future[None]]) -> None:
        """Wait for ``futures``, but stop at the first record that could not be written."""
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.5)
            self._check_written()

    def _generate_and_submit(
        self,
        batch: Sequence[tuple[Task, int]],
        turn: int,
        store: SamplesFile,
        progress: Progress,
        bar: Any,
    ) -> list[Future[None]]:
        requests = [
            Request(
                task.id,
                sample,
                turn,
                self.prompts.conversation(task, self._history(task, sample, turn)),
                sample_seed(self.config.seed, task.id, sample, turn),
            )
            for task, sample in batch
        ]
        started = time.perf_counter()
        generations = self.client.generate(requests)
        if len(generations) != len(requests):
            raise RuntimeError(
                f"{self.client.name} returned {len(generations)} completions for {len(requests)} prompts"
            )
        seconds = (time.perf_counter() - started) / len(requests)
        futures = self.pool.submit([task for task, _ in batch], [g.text for g in generations])
        self._submitted.extend(futures)
        # Resolved once the record is written (a pool future resolves before its callbacks
        # run): the next turn must see every record of this one.
        written: list[Future[None]] = []
        for future, (task, sample), generation in zip(futures, batch, generations, strict=True):
            done: Future[None] = Future()
            written.append(done)
            future.add_done_callback(
                lambda f, t=task, s=sample, g=generation, d=done: self._finished(
                    f, t, s, turn, g, seconds, store, progress, bar, d
                )
            )
            self._written.append(done)  # after the callback: a stop never waits on a lone one
        return written

    def _finished(
        self,
        future: Future[EvalResult],
        task: Task,
        sample: int,
        turn: int,
        generation: Generation,
        seconds: float,
        store: SamplesFile,
        progress: Progress,
        bar: Any,
        done: Future[None],
    ) -> None:
        """Pool callback thread: persist the attempt at once."""
        try:
            if not future.cancelled():  # cancelled: the sweep stopped before it started
                self._record(future, task, sample, turn, generation, seconds, store)
        except _NotWritten as exc:  # evaluated, but the store refused it (a full disk)
            with self._lock:
                self.lost += 1
                self.write_error = self.write_error or exc.error
        except Exception as exc:  # not evaluated (e.g. a broken task)
            error = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            with self._lock:
                self.failures.append(f"{task.id} sample {sample} turn {turn}: {exc}")
                self.not_evaluated.setdefault(task.id, error)
        finally:
            progress.advance(bar)
            done.set_result(None)

    def _record(
        self,
        future: Future[EvalResult],
        task: Task,
        sample: int,
        turn: int,
        generation: Generation,
        seconds: float,
        store: SamplesFile,
    ) -> None:
        result = future.result()
        record = SampleRecord(
            task_id=task.id,
            sample=sample,
            turn=turn,
            result=result,
            completion=generation.text,
            level=task.level,
            category=task.category,
            finish_reason=generation.finish_reason,
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
            generation_s=round(seconds, 4),
            extra=dict(generation.extra),
        )
        served = getattr(self.client, "model", None)
        if self.config.client == "openai" and isinstance(served, str):
            record.extra.setdefault("served_model", served)  # what the endpoint ran
        try:
            store.append(record)
        except OSError as exc:
            raise _NotWritten(exc) from exc
        with self._lock:
            self.records[record.key] = record
            self.new += 1


class _NotWritten(Exception):
    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _WriteFailed(Exception):
    """Raised in the sweep's thread once a record could not be written."""
