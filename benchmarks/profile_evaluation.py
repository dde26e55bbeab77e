"""Where one evaluation spends the trusted process's time, function by function.

Each named KernelBench solution is evaluated twice by one ``Evaluator``, one evaluation at a
time: the first fills the reference-timing cache, the second (as in training, the reference's
timing cached) runs under cProfile. Printed per solution: the second evaluation's phases, then
the profile's kernelrl and torch functions by cumulative time and the whole profile by own time.
The phases say which step is long; the profile says what inside it, e.g. a per-chunk cost that
a phase's total hides.

    python benchmarks/profile_evaluation.py --kernelbench KB/KernelBench 19_ReLU 23_Softmax
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernelbench_entries import solution_entries  # noqa: E402
from kernelbench_kernelrl import ensure_kernelrl_importable  # noqa: E402

SOLUTIONS = Path(__file__).resolve().parent / "kernelbench_solutions"


def profile_text(profile: cProfile.Profile, top: int) -> str:
    """The trusted side's own code, the tensor and CUDA calls it makes and where it waits, by
    cumulative time; then everything by own time."""
    import kernelrl

    own = re.escape(str(Path(kernelrl.__file__).parent)) + r"|torch/(cuda|_tensor)|socket|select"
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("cumulative").print_stats(own, top)
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernelbench", type=Path, required=True, help="task root (level1/ ...)")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--top", type=int, default=40, help="functions listed per ordering")
    parser.add_argument("names", nargs="+", help="solution stems or levelN/stem")
    args = parser.parse_args(argv)
    entries = solution_entries(args.solutions, args.kernelbench, set(args.names))
    if not entries:
        parser.error(f"no solution in {args.solutions} is named {' or '.join(args.names)}")
    ensure_kernelrl_importable()
    from kernelrl.env.evaluator import EvalConfig, Evaluator
    from kernelrl.env.task import task_from_source

    with Evaluator(EvalConfig(device=args.device), in_flight=1) as evaluator:
        evaluator.warm()
        for entry in entries:
            task = task_from_source(entry.task_src, entry.key, "triton", entry.level)
            first = evaluator.evaluate(task, entry.solution_src)
            profile = cProfile.Profile()
            second = profile.runcall(evaluator.evaluate, task, entry.solution_src)
            phases = {k: round(v, 3) for k, v in second.phase_seconds.items() if v >= 0.01}
            print(f"{entry.key}: {first.status.value}, then {second.status.value}; phases {phases}")
            print(profile_text(profile, args.top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
