"""The ``kernelrl`` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from kernelrl.env.pools import EVALS_PER_GPU
from kernelrl.env.task import TaskError
from kernelrl.launch import (
    curate_cli,
    env_service_cli,
    eval_cli,
    openai_serve_cli,
    openenv_serve_cli,
    quiet,
    sft_cli,
    synth_cli,
    topology_cli,
    train_cli,
    versions,
)
from kernelrl.launch.errors import UserError, check_parent_folder

# At import, not only in main: vLLM's engine processes are spawned and import this module (the
# parent's __main__) before vLLM, so its known messages are filtered there too.
quiet.install()


def _env_check(args: argparse.Namespace) -> int:
    from kernelrl.env.evaluator import EvalConfig, Evaluator
    from kernelrl.env.task import load_task

    backend = args.backend or "triton"
    task = load_task(args.task, backend=backend)
    try:
        completion = Path(args.solution).read_text()
    except OSError as exc:
        raise TaskError(f"cannot read solution {args.solution}: {exc.strerror or exc}") from exc
    config = EvalConfig(device=args.device, timeout_s=args.timeout, spare_children=0)
    evaluator = Evaluator(config)
    try:
        result = evaluator.evaluate(task, completion)
    finally:
        evaluator.close()
    if args.json:
        print(result.to_json())
    else:
        from kernelrl.env.report import print_result

        print_result(result, Console())
    if args.backend is None:  # judged as Triton by default: say so when it is the other language
        hint = backend_hint(completion, backend)
        if hint:
            print(f"kernelrl env check: {hint}", file=sys.stderr)
    return 0


def backend_hint(completion: str, backend: str) -> str | None:
    """One line when a solution judged as ``backend`` (the default, not chosen) is written in
    another backend's language only: its verdict (``other_compiler``) is then the flag's doing,
    and the user needs the flag, not the check's name."""
    from kernelrl.env.backends import BACKENDS
    from kernelrl.env.parse import FormatError, extract_solution, import_aliases
    from kernelrl.env.python_syntax import parse_python

    try:
        tree = parse_python(extract_solution(completion))
    except (FormatError, SyntaxError, ValueError):
        return None
    aliases = import_aliases(tree)
    used = [b for b in BACKENDS.values() if b.used_by(tree, aliases)]
    if len(used) != 1 or used[0].name == backend:
        return None
    other = used[0]
    return (
        f"the solution is written in {other.display_name} ({other.kernel_form}) and was judged "
        f"as a {BACKENDS[backend].display_name} solution (the default); run it with --backend "
        f"{other.name}"
    )


def _env_check_suite(args: argparse.Namespace) -> int:
    from kernelrl.data.bundled import bundled_pairs
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools import make_pool
    from kernelrl.env.report import run_suite

    pairs = bundled_pairs(args.backend)
    if args.tasks:
        pairs = [
            (t, s) for t, s in pairs if any(pattern in t.id for pattern in args.tasks.split(","))
        ]
    if not pairs:
        raise TaskError("no bundled task matches the selection")
    if args.json_out and args.json_out != "-":
        check_parent_folder(args.json_out, "--json-out")
    config = EvalConfig(device=args.device, timeout_s=args.timeout)
    console = Console(stderr=args.json_out == "-")
    pool = make_pool(args.pool, config, workers=args.workers, per_gpu=args.per_gpu)
    with pool:
        results = run_suite(pool, pairs, console, repeats=args.repeats)
    # Harness errors are kernelrl's failures, not the bundled solutions': a line of their own.
    harness = [r for r in results if not r.scored]
    scored = [r for r in results if r.scored]
    console.print(
        f"solutions: {sum(r.correct for r in scored)} of {len(scored)} scored evaluations correct; "
        f"harness errors: {len(harness)} (not the solution's fault; rerun)"
        + (f": {', '.join(sorted({r.task_id for r in harness}))}" if harness else ""),
        soft_wrap=True,
        markup=False,
    )
    if args.json_out:
        lines = "\n".join(r.to_json() for r in results) + "\n"
        if args.json_out == "-":
            sys.stdout.write(lines)
        else:
            Path(args.json_out).write_text(lines)
    return 0 if all(r.correct for r in results) else 1


def _version() -> str:
    """The installed distribution's version (an editable install reports pyproject's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kernelrl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelrl", description="RL for LLMs that write GPU kernels."
    )
    parser.add_argument("--version", action="version", version=f"kernelrl {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    env = commands.add_parser(
        "env", help="the kernel environment: evaluate solutions"
    ).add_subparsers(dest="env_command", required=True)
    check = env.add_parser("check", help="evaluate one solution against one task")
    check.add_argument("--task", required=True, help="KernelBench-format task file")
    check.add_argument(
        "--solution", required=True, help="solution file (code or a model completion)"
    )
    check.add_argument(
        "--backend",
        choices=["triton", "cuda"],
        default=None,
        help="the kernel language the solution is judged as (default: triton)",
    )
    check.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    check.add_argument("--timeout", type=float, default=180.0, help="seconds for the sandboxed run")
    check.add_argument("--json", action="store_true", help="print exactly one JSON object")
    check.set_defaults(handler=_env_check)

    suite = env.add_parser(
        "check-suite", help="run every bundled task against its bundled solution"
    )
    suite.add_argument("--backend", choices=["triton", "cuda"], default="triton")
    suite.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    suite.add_argument("--workers", type=int, default=None, help="CPU slots or GPUs (default: all)")
    suite.add_argument(
        "--pool",
        choices=["local", "ray"],
        default="local",
        help="ray: one Ray actor per GPU (logical GPUs on CPU)",
    )
    suite.add_argument(
        "--per-gpu",
        type=int,
        default=EVALS_PER_GPU,
        help="evaluations in flight per GPU (per logical GPU on CPU; 0: sized from the host)",
    )
    suite.add_argument("--tasks", default="", help="comma-separated substrings of task ids")
    suite.add_argument("--repeats", type=int, default=1, help="evaluate every pair this many times")
    suite.add_argument("--timeout", type=float, default=180.0)
    suite.add_argument(
        "--json-out", default="", help="write every EvalResult as JSONL ('-' for stdout)"
    )
    suite.set_defaults(handler=_env_check_suite)
    env_service_cli.add_subcommand(env)
    openenv_serve_cli.add_subcommand(env)
    eval_cli.add_subcommand(commands)
    curate_cli.add_subcommand(commands)
    synth_cli.add_subcommand(commands)
    sft_cli.add_subcommand(commands)
    train_cli.add_subcommand(commands)
    topology_cli.add_subcommand(commands)
    openai_serve_cli.add_subcommand(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    versions.quiet_trl_vllm_warning()
    quiet.install()  # known third-party noise, filtered by logger and text (launch/quiet.py)
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UserError as exc:
        command = " ".join(c for c in (args.command, getattr(args, "env_command", None)) if c)
        print(f"kernelrl {command}: {exc}", file=sys.stderr)
        return 2
    except (TaskError, ValueError) as exc:
        print(f"kernelrl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
