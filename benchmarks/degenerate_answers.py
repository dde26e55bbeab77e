"""Which answers that carry no information pass kernelrl's output check, before and after the
information check (``env/compare.py``; docs/threat-model.md, "What `correct` means").

For every task (KernelBench levels 1-3 at their published sizes on a GPU, or at the CPU sizes
of ``kernelrl.env.sizes.size_overrides`` with ``--device cpu --sizes cpu``) the reference is built as the
trusted side builds it (``ReferenceRunner``) and answers are compared with it as a solution's
outputs are (``OutputMatcher``, streamed in chunks, one input set):

- ``zeros``; ``constant``: the mean, or the median of a sample when the mean does not pass the
  elementwise tolerance; ``row mean``: the mean along the last dimension, per row;
- ``exact``: the task computed in float64 and rounded to the output's dtype, what a perfectly
  accurate kernel returns. Where it fails the new check, the reference carries less
  information than its own rounding: a correct kernel could be judged incorrect there.

Each answer gets the old verdict (elementwise tolerance only) and the new one, which includes
the evaluator's rerun of the reference on its inputs moved by one ulp: answers over the bound
that it excuses are listed, since there the reference is rounding noise (the output carries no
information at its precision). Per task also: ``information``, the best degenerate answer's
RMS error over the reference's RMS (how much of the output is not explained by a constant along
some axis), and ``exact/bound``, the exact answer's RMS error over the largest accepted (the
closer to 1, the less margin a correct kernel has; over 1 only where excused).

A task that does not load, fails or runs out of memory is recorded and the run goes on; a task
past ``--task-seconds`` skips its remaining answers, which the report lists as capped.

    python benchmarks/degenerate_answers.py --kernelbench KernelBench --out runs/degenerate
    python benchmarks/degenerate_answers.py --kernelbench KernelBench --levels 1 \
        --device cpu --sizes cpu --out runs/degenerate_cpu
    python benchmarks/degenerate_answers.py data/tasks/14_softmax_rows.py --device cpu --out DIR
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kernelrl.env import compare
from kernelrl.env.compare import OutputMatcher, describe_outputs
from kernelrl.env.information import rerolled_reference
from kernelrl.env.reference import ReferenceRunner, device_name
from kernelrl.env.sandbox import harness
from kernelrl.env.sizes import size_overrides
from kernelrl.env.task import Task, TaskError, load_task, load_task_folder
from kernelrl.eval.benchmarks import load_kernelbench_folder

ANSWERS = ("zeros", "constant", "row_mean", "exact")
CHUNK = 2**24  # elements per streamed chunk of an answer (the evaluator's 64 MiB of fp32)
MODEL_SEED, INPUT_SEED = 0, 1
EXACT_COST = 10.0  # the float64 run's time, in multiples of the reference's (a guess, kept loose)


# ------------------------------------------------------------------ tasks
def load_tasks(paths: list[str], kernelbench: str | None, levels: list[int]) -> list[Task]:
    tasks: list[Task] = []
    if kernelbench:
        tasks += [t for t in load_kernelbench_folder(kernelbench) if t.level in levels]
    for name in paths:
        path = Path(name)
        if not path.exists():
            raise SystemExit(f"no such task file or folder: {name}")
        tasks += load_task_folder(path) if path.is_dir() else [load_task(path)]
    if not tasks:
        raise SystemExit("no tasks: give task files or folders, or --kernelbench DIR")
    return tasks


def with_sizes(task: Task, device_kind: str, sizes: str) -> Task:
    """The task as the runner on ``device_kind`` should build it at ``sizes`` ('cpu' or
    'published'): the sizes of the other kind, moved to this one."""
    if sizes == "cpu" and device_kind != "cpu":
        return dataclasses.replace(
            task, sizes={**task.sizes, device_kind: size_overrides(task, "cpu")}
        )
    if sizes == "published" and device_kind == "cpu":
        return dataclasses.replace(
            task, sizes={**task.sizes, "cpu": dict(task.sizes.get("cuda", {}))}
        )
    return task


# ------------------------------------------------------------------ answers
def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 0


def _chunks(flat: torch.Tensor) -> Iterator[torch.Tensor]:
    for start in range(0, flat.numel(), CHUNK):
        yield flat[start : start + CHUNK]


def _finite_sum(flat: torch.Tensor) -> tuple[float, float]:
    count, total = 0.0, 0.0
    for part in _chunks(flat):
        part = part.double()
        finite = torch.isfinite(part)
        count += float(finite.sum())
        total += float(torch.where(finite, part, 0.0).sum())
    return count, total


def _constant(flat: torch.Tensor, kind: str) -> float:
    """The mean, or the median of a strided sample of at most 2**20 values, over finite ones."""
    if kind == "mean":
        count, total = _finite_sum(flat)
        return total / max(count, 1.0)
    sample = flat[:: max(1, flat.numel() // 2**20)].double()
    sample = sample[torch.isfinite(sample)]
    return float(sample.median()) if sample.numel() else 0.0


def _row_means(ref: torch.Tensor) -> torch.Tensor | None:
    """Finite mean of each row (last dimension), in float64; None where the rows are single
    values (the row mean is then the reference) or too many to hold (over CHUNK)."""
    if ref.dim() == 0 or ref.shape[-1] <= 1 or ref.numel() // ref.shape[-1] > CHUNK:
        return None
    rows = ref.reshape(-1, ref.shape[-1])
    count = torch.zeros(rows.shape[0], dtype=torch.float64, device=ref.device)
    total = torch.zeros_like(count)
    step = max(1, CHUNK // rows.shape[0])
    for start in range(0, rows.shape[1], step):
        part = rows[:, start : start + step].double()
        finite = torch.isfinite(part)
        count += finite.sum(1)
        total += torch.where(finite, part, 0.0).sum(1)
    return total / count.clamp_min(1)


def answer_stream(
    kind: str, ref: torch.Tensor, constant: str = "mean"
) -> Iterator[torch.Tensor] | None:
    """Chunks of a degenerate answer for one floating output; None when the answer is not
    degenerate for it (the row mean of rows of one value is the reference)."""
    flat = ref.reshape(-1)
    if kind == "zeros":
        return (torch.zeros_like(c) for c in _chunks(flat))
    if kind == "constant":
        if flat.numel() <= 1:  # one value: the constant is the reference
            return None
        value = _constant(flat, constant)
        return (torch.full_like(c, value) for c in _chunks(flat))
    means = _row_means(ref)
    if means is None:
        return None
    width = ref.shape[-1]

    def rows() -> Iterator[torch.Tensor]:
        for start in range(0, flat.numel(), CHUNK):
            stop = min(start + CHUNK, flat.numel())
            index = torch.arange(start, stop, device=ref.device) // width
            yield means[index].to(ref.dtype)

    return rows()


@dataclasses.dataclass
class Reference:
    """One task's reference outputs, with what every answer compared to them shares: the
    statistics (computed once) and the rerun on nudged inputs (computed once, when a check
    first asks for it, as the evaluator does)."""

    task: Task
    runner: ReferenceRunner
    model: torch.nn.Module
    expected: list[Any]
    statistics: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    rerun_outputs: list[Any] | None = None

    def rerun(self) -> list[Any]:
        if self.rerun_outputs is None:
            module = self.runner.module(self.task)
            self.rerun_outputs = rerolled_reference(
                module, self.model, INPUT_SEED, self.runner.device
            )
        return self.rerun_outputs


def judge(ref: Reference, streams: dict[int, Iterator[torch.Tensor]]) -> dict[str, Any]:
    """Old and new verdicts of the answer made of ``streams`` (the reference elsewhere)."""
    matcher = OutputMatcher(ref.task, ref.expected, 0, ref.statistics, rerun=ref.rerun)
    matcher.check_description(describe_outputs(ref.expected))
    for k, value in enumerate(ref.expected):
        if isinstance(value, torch.Tensor):
            for chunk in streams.get(k, _chunks(value.reshape(-1))):
                matcher.add_chunk(k, chunk)
    result = matcher.finish()
    over = result.rms_err is not None and result.rms_err > (result.information_bound or 0.0)
    return {
        "old": len(result.problems) == result.uninformative,
        "new": result.correct,
        "ratio": result.information_ratio,
        "rms": result.rms_err,
        "bound": result.information_bound,
        "best": result.degenerate_rms,
        "best_answer": result.degenerate_answer,
        "noise": result.reference_noise,
        # over the bound, yet not rejected for it: the reference is noise at that level
        "excused": over and result.uninformative == 0 and result.reference_noise is not None,
        "problem": result.problems[0][:300] if result.problems else "",
    }


def degenerate(ref: Reference, kind: str) -> dict[str, Any] | None:
    floats = [k for k, value in enumerate(ref.expected) if _floating(value)]
    if kind == "constant":
        verdict = None
        for constant in ("mean", "median"):  # the mean first; the median if it fails
            streams = {
                k: s
                for k in floats
                if (s := answer_stream(kind, ref.expected[k], constant)) is not None
            }
            if not streams:
                return None
            verdict = {**judge(ref, streams), "constant": constant}
            if verdict["old"]:
                break
        return verdict
    streams = {k: s for k in floats if (s := answer_stream(kind, ref.expected[k])) is not None}
    return judge(ref, streams) if streams else None


def exact_answer(ref: Reference) -> dict[str, Any]:
    """The task computed in float64 (default dtype too, for tensors its forward creates),
    rounded to each output's dtype, judged like any answer."""
    module = ref.runner.module(ref.task)
    inputs = harness.make_inputs(module, INPUT_SEED, ref.runner.device)
    inputs = [x.double() if _floating(x) else x for x in inputs]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            outputs = harness.as_output_list(copy.deepcopy(ref.model).double()(*inputs))
    finally:
        torch.set_default_dtype(previous)
    del inputs
    streams = {}
    for k, value in enumerate(ref.expected):
        if _floating(value) and isinstance(outputs[k], torch.Tensor):
            outputs[k] = outputs[k].to(value.dtype).reshape(-1)
            streams[k] = _chunks(outputs[k])
    return judge(ref, streams)


# ------------------------------------------------------------------ one task
def run_task(task: Task, device: torch.device, task_seconds: float) -> dict[str, Any]:
    started = time.perf_counter()
    record: dict[str, Any] = {"task": task.id, "level": task.level, "status": "ok", "capped": []}
    runner = ReferenceRunner(device)
    try:
        model = runner.model(task, MODEL_SEED)
        expected = runner.output(task, model, INPUT_SEED)
        _sync(device)
        record["reference_s"] = round(time.perf_counter() - started, 3)
        record["outputs"] = [_describe(v) for v in expected]
        if not any(_floating(v) for v in expected):
            record["status"] = "no float output"
            return record
        ref = Reference(task, runner, model, expected)
        stages: list[tuple[str, Callable[[], Any]]] = [
            (kind, lambda kind=kind: degenerate(ref, kind)) for kind in ANSWERS[:3]
        ] + [("exact", lambda: exact_answer(ref))]
        for kind, stage in stages:
            # float64 runs slower than the reference (cuDNN's fp64 convolutions most): it
            # starts only when EXACT_COST of the reference's time still fits under the cap
            cost = EXACT_COST * record["reference_s"] if kind == "exact" else 0.0
            if time.perf_counter() - started + cost > task_seconds:
                record["capped"].append(kind)
                continue
            stage_started = time.perf_counter()
            try:
                record[kind] = stage()
            except torch.OutOfMemoryError:
                record[kind] = {"error": "out of memory"}
            except Exception as exc:  # an answer the task cannot make (float64 unsupported)
                record[kind] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            _sync(device)
            if kind == "zeros":  # the first comparison also computes the reference's statistics
                record["check_s"] = round(time.perf_counter() - stage_started, 3)
        record.update(_information(record))
    except torch.OutOfMemoryError:
        record["status"], record["error"] = "out of memory", "the reference does not fit"
    except TaskError as exc:
        record["status"], record["error"] = "task error", str(exc)[:300]
    except Exception as exc:
        record["status"], record["error"] = "error", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        record["seconds"] = round(time.perf_counter() - started, 3)
        sys.modules.pop(f"kernelrl_reference_{task.hash}_{harness.device_kind(device)}", None)
    return record


def _information(record: dict[str, Any]) -> dict[str, Any]:
    zeros = record.get("zeros") or {}
    exact = record.get("exact") or {}
    out: dict[str, Any] = {"best_answer": zeros.get("best_answer", "")}
    if zeros.get("best") is not None and zeros.get("rms"):
        out["information"] = zeros["best"] / zeros["rms"]  # zeros' error is the reference's RMS
    if exact.get("bound"):
        out["exact_vs_bound"] = (exact.get("rms") or 0.0) / exact["bound"]
    return out


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return type(value).__name__


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ report
def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """How many tasks each answer fooled (judged correct) before and after."""
    ran = [r for r in records if r["status"] == "ok"]
    summary: dict[str, Any] = {"tasks": len(records), "compared": len(ran)}
    for kind in ANSWERS:
        judged = [r[kind] for r in ran if isinstance(r.get(kind), dict) and "old" in r[kind]]
        summary[kind] = {
            "judged": len(judged),
            "old": sum(v["old"] for v in judged),
            "new": sum(v["new"] for v in judged),
        }
    exact = [(r["task"], r["exact"]) for r in ran if isinstance(r.get("exact"), dict)]
    # the information check's doing: the exact answer within the tolerance, yet rejected
    summary["exact_rejected"] = sorted(t for t, v in exact if v.get("old") and not v["new"])
    summary["exact_outside_tolerance"] = sorted(t for t, v in exact if v.get("old") is False)
    summary["noise"] = sorted(
        r["task"]
        for r in ran
        if any(isinstance(r.get(k), dict) and r[k].get("excused") for k in ANSWERS)
    )
    summary["not_compared"] = sorted(f"{r['task']}: {r['status']}" for r in records if r not in ran)
    summary["capped"] = sorted(f"{r['task']}: {', '.join(r['capped'])}" for r in ran if r["capped"])
    return summary


def summary_line(summary: dict[str, Any]) -> str:
    parts = [
        f"{kind} fooled {summary[kind]['old']} -> {summary[kind]['new']} of {summary[kind]['judged']}"
        for kind in ANSWERS[:3]
    ]
    exact = summary["exact"]
    return (
        f"{summary['compared']}/{summary['tasks']} tasks compared; "
        + "; ".join(parts)
        + f" (old check -> new); the exact answer passes {exact['old']} -> {exact['new']}"
        f" of {exact['judged']}"
    )


def _cell(verdict: Any) -> str:
    if not isinstance(verdict, dict):
        return "-"
    if "error" in verdict:
        return "n/a"
    mark = lambda ok: "pass" if ok else "fail"  # noqa: E731
    constant = f" ({verdict['constant']})" if "constant" in verdict else ""
    return f"{mark(verdict['old'])} / {mark(verdict['new'])}{constant}"


def _number(value: Any) -> str:
    return f"{value:.2g}" if isinstance(value, float) else "-"


def markdown(records: list[dict[str, Any]], summary: dict[str, Any], setup: dict[str, Any]) -> str:
    lines = [
        "# Degenerate answers against the output check",
        "",
        f"Device: {setup['device']}; sizes: {setup['sizes']}; information ratio "
        f"{compare.INFORMATION_RATIO:g}; rounding floor {compare.FLOOR_OUTPUT_ULPS:g} ulps of the "
        f"output + {compare.FLOOR_COMPUTE_EPS:g} eps of fp32 (fp64 outputs: fp64) arithmetic; "
        f"wall time {setup['seconds']:.0f} s; per-task cap {setup['task_seconds']:g} s.",
        "",
        f"**Summary:** {summary_line(summary)}.",
        "",
        "Cells: old check (elementwise tolerance) / new check (with the information check); "
        "`pass` means the answer would be judged correct. `information`: the best degenerate "
        "answer's RMS error over the reference's RMS. `exact/bound`: the float64-computed "
        "answer's RMS error over the largest accepted.",
        "",
        "| task | outputs | information | best degenerate answer | zeros | constant | row mean "
        "| exact | exact/bound | check s | s | notes |",
        "| --- | --- | ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in records:
        notes = r.get("error", "") if r["status"] != "ok" else ""
        if r["capped"]:
            notes += f"capped: {', '.join(r['capped'])}"
        if r["status"] != "ok":
            notes = f"{r['status']}: {notes}"
        lines.append(
            f"| {r['task']} | {', '.join(r.get('outputs', []))} | {_number(r.get('information'))} "
            f"| {r.get('best_answer', '')} | {_cell(r.get('zeros'))} | {_cell(r.get('constant'))} "
            f"| {_cell(r.get('row_mean'))} | {_cell(r.get('exact'))} "
            f"| {_number(r.get('exact_vs_bound'))} | {_number(r.get('check_s'))} "
            f"| {r['seconds']:.1f} | {notes.replace('|', '/')} |"
        )
    for title, key in (
        ("Exact answers the information check rejects", "exact_rejected"),
        (
            "Exact answers outside the elementwise tolerance (the fp32 reference is less "
            "accurate than the tolerance asks: the old check's own limit)",
            "exact_outside_tolerance",
        ),
        (
            "References that are rounding noise at the bound (an answer over it was left to the "
            "elementwise tolerance: moving the inputs by one ulp moves the reference as far)",
            "noise",
        ),
        ("Not compared", "not_compared"),
        ("Capped", "capped"),
    ):
        lines += (
            ["", f"## {title}", ""]
            + [f"- {x}" for x in summary[key]]
            + ([] if summary[key] else ["none"])
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="task files or folders of task files")
    parser.add_argument("--kernelbench", help="a KernelBench checkout (its level<N>/ folders)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--sizes", choices=["published", "cpu"], help="default: the device's")
    parser.add_argument("--task-seconds", type=float, default=3.0, help="no new answer after")
    parser.add_argument("--limit", type=int, help="the first N tasks only")
    parser.add_argument("--out", required=True, help="folder for degenerate_answers.md/.json")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU is visible (use --device cpu --sizes cpu)")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    sizes = args.sizes or ("published" if args.device == "cuda" else "cpu")
    tasks = load_tasks(args.paths, args.kernelbench, args.levels)[: args.limit]
    started, records = time.perf_counter(), []
    for index, task in enumerate(tasks):
        try:
            sized = with_sizes(task, harness.device_kind(device), sizes)
        except TaskError as exc:
            records.append(
                {
                    "task": task.id,
                    "status": "task error",
                    "error": str(exc)[:300],
                    "capped": [],
                    "seconds": 0.0,
                }
            )
            continue
        records.append(run_task(sized, device, args.task_seconds))
        _free(device)
        r = records[-1]
        print(
            f"[{index + 1}/{len(tasks)}] {task.id}: {r['status']} {r['seconds']:.1f}s", flush=True
        )
    setup = {
        "device": device_name(device),
        "sizes": sizes,
        "task_seconds": args.task_seconds,
        "seconds": time.perf_counter() - started,
    }
    summary = summarize(records)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "degenerate_answers.md").write_text(markdown(records, summary, setup))
    payload = {"setup": setup, "summary": summary, "tasks": records}
    (out / "degenerate_answers.json").write_text(json.dumps(payload, indent=1, default=str))
    print(summary_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
