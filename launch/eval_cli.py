"""``kernelrl eval``: evaluation sweeps, reports and comparisons.

    kernelrl eval --config recipes/eval/smoke_cpu.yaml [--key value ...]
    kernelrl eval compare RUN_A RUN_B [--view best|last] [--output FILE]
    kernelrl eval report RUN [--no-plots]

``eval`` has both a direct form (a sweep from a recipe) and subcommands, and a recipe's keys
are overridden by ``--key value`` flags that only the recipe's dataclass knows. argparse
cannot mix optional subcommands with free-form flags, so the ``eval`` subparser takes every
word after ``eval`` verbatim (``launch.recipe.add_recipe_command``, which also answers
``--help``) and this module dispatches: ``compare`` and ``report`` get their own small parsers, and
anything else is a recipe parsed the TRL way (``trl.TrlParser``: YAML defaults, flags on top).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from kernelrl.launch.errors import UserError
from kernelrl.launch.recipe import add_recipe_command, parse_recipe

USAGE = """usage: kernelrl eval --config RECIPE.yaml [--key value ...]   run a sweep (resumable)
       kernelrl eval compare RUN_A RUN_B [--view best|last] [--output FILE]
       kernelrl eval report RUN [--no-plots]                       rebuild a run's report

Every recipe key can be given as a flag (--samples 4 --max_turns 2); `kernelrl eval --help` lists
them."""


def add_subcommand(commands: Any) -> None:
    add_recipe_command(
        commands,
        "eval",
        help="evaluation sweeps (kernelrl eval --config X | compare A B | report RUN)",
        run=_eval,
        recipe_types=_recipe_types,
        usage=USAGE,
    )


def _recipe_types() -> tuple[type, ...]:
    from kernelrl.eval.config import EvalSweepConfig

    return (EvalSweepConfig,)


def _eval(words: list[str]) -> int:
    if words[0] == "compare":
        return _compare(words[1:])
    if words[0] == "report":
        return _report(words[1:])
    return _sweep(words)


# ---------------------------------------------------------------------------------- recipes
def parse_sweep_recipe(words: list[str]) -> Any:
    """EvalSweepConfig from ``--config FILE`` plus flag overrides (``RecipeError`` if unusable)."""
    (config,) = parse_recipe(words, _recipe_types(), "kernelrl eval")
    return config


def _fixed_sources(config: Any) -> list[str]:
    """``bundled`` in fixed_solutions names kernelrl's own solutions for the sweep's backend."""
    from kernelrl.data.bundled import SOLUTIONS_DIR

    return [
        str(SOLUTIONS_DIR / config.backend) if s == "bundled" else s for s in config.fixed_solutions
    ]


def make_client(config: Any, task_ids: list[str]) -> Any:
    from kernelrl.eval.clients import OpenAIClient, Sampling, TransformersClient, VLLMClient

    sampling = Sampling(config.temperature, config.top_p, config.max_tokens)
    if config.client == "fixed":
        from kernelrl.eval.fixed import FixedSolutions

        return FixedSolutions(_fixed_sources(config), task_ids)
    if config.client == "openai":
        return OpenAIClient(
            config.api_base,
            config.served_model_name,
            sampling,
            api_key=os.environ.get(config.api_key_env),
            concurrency=config.request_concurrency,
            timeout_s=config.request_timeout_s,
        )
    from kernelrl.launch.adapters import merged_folder, resolve_policy

    policy = resolve_policy(config.model_name_or_path)  # a hub id: cached or reachable, or why not
    # vLLM on CPU serves no LoRA: an adapter is merged into a copy of its base, once
    model = merged_folder(policy) if policy.adapter else policy.base
    if config.client == "transformers":
        return TransformersClient(
            model, sampling, dtype=config.dtype, batch_size=config.generation_batch
        )
    return VLLMClient(
        model,
        sampling,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        enforce_eager=config.enforce_eager,
        gpu_memory_utilization=config.gpu_memory_utilization,
        tensor_parallel_size=config.tensor_parallel_size,
        seed=config.seed,
        cpu_kv_cache_gb=config.cpu_kv_cache_gb,
    )


def load_tasks(config: Any) -> list[Any]:
    from kernelrl.eval.benchmarks import load_benchmark

    path = config.benchmark_path
    if config.benchmark == "bundled" and not path:
        from kernelrl.data.bundled import TASKS_DIR

        path = str(TASKS_DIR)
    return load_benchmark(
        config.benchmark,
        path,
        config.backend,
        config.levels,
        config.problem_ids,
        config.task_regex,
        config.max_tasks,
    )


# ---------------------------------------------------------------------------------- commands
def _sweep(words: list[str]) -> int:
    from kernelrl.eval.report import print_summary, write_report
    from kernelrl.eval.sweep import Sweep

    config = parse_sweep_recipe(words)
    if config.client in ("vllm", "transformers"):  # a typo fails here, not after the sweep starts
        from kernelrl.launch.models import check_model_value

        check_model_value(config.model_name_or_path)
    console = Console(stderr=True)
    tasks = load_tasks(config)
    _announce(config, tasks, console)
    folder = Path(config.output_dir)
    if config.client != "fixed" and Sweep(config, tasks, None, None, console).pending() == 0:
        console.print(f"{folder}: every attempt is done; rebuilding the report", soft_wrap=True)
        summary = write_report(folder, plots=config.plots)
        print_summary(summary, console)
        _log_wandb(config, summary, console)
        return 0
    outcome = _run_sweep(config, tasks, console)
    if outcome is None:
        return 130
    return _finish(config, outcome, console)


def _announce(config: Any, tasks: list[Any], console: Console) -> None:
    """One line before the (possibly long) start: how many tasks, from whom, to where."""
    if config.client == "openai":
        served = config.served_model_name or "(the server's model)"
        who = f"{served} @ {config.api_base}"
    elif config.client == "fixed":
        who = ", ".join(config.fixed_solutions)
    else:
        who = config.model_name_or_path
    console.print(
        f"kernelrl eval: {len(tasks)} task{'' if len(tasks) == 1 else 's'}, {config.client} "
        f"{who} -> {config.output_dir}",
        soft_wrap=True,
    )


def _run_sweep(config: Any, tasks: list[Any], console: Console) -> Any:
    """The sweep's outcome, or None after Ctrl-C (said on stderr: exit 130); a stop that is not
    an interruption, or an endpoint that does not answer, is a ``UserError``."""
    from kernelrl.eval.clients import EndpointUnreachable
    from kernelrl.eval.sweep import Sweep, SweepStopped

    stopped: SweepStopped | None = None
    try:
        try:
            # The model first: vLLM starts its engine processes before the pool starts threads.
            client = make_client(config, [t.id for t in tasks])
            try:
                pool = config.make_pool()
                try:
                    outcome = Sweep(config, tasks, client, pool, console).run()
                except SweepStopped as exc:
                    stopped = exc
                finally:
                    _quietly(pool.close)
            finally:
                _quietly(client.close)
        except EndpointUnreachable as exc:  # the sweep resumes once a server answers
            raise UserError(str(exc)) from None
    except KeyboardInterrupt:  # while the model or the pool started, or while they closed
        if stopped is None:
            print(
                f"kernelrl eval: interrupted before any attempt of this run was saved; "
                f"{Path(config.output_dir)} is as it was; run the same command again to start",
                file=sys.stderr,
            )
            return None
    if stopped is not None:
        if stopped.interrupted:
            print(f"kernelrl eval: {stopped}", file=sys.stderr)
            return None
        raise UserError(str(stopped))
    return outcome


def _finish(config: Any, outcome: Any, console: Console) -> int:
    """Write and print the report of a finished sweep; exit 1 when some task went
    unevaluated."""
    from kernelrl.eval.report import print_summary, write_report

    try:
        summary = write_report(outcome.folder, plots=config.plots)
    except OSError as exc:  # e.g. a full disk after the sweep: samples.jsonl holds everything
        from kernelrl.eval.records import write_fix

        raise UserError(
            f"every attempt is saved in {outcome.folder / 'samples.jsonl'}, but the report could "
            f"not be written ({exc.strerror or exc}); {write_fix(exc, outcome.folder)} and run "
            f"`kernelrl eval report {outcome.folder}`"
        ) from None
    print_summary(summary, console)
    console.print(
        f"{outcome.new_records} new attempt{'' if outcome.new_records == 1 else 's'} in "
        f"{outcome.seconds:.0f} s; "
        f"report: {outcome.folder / 'report.md'}",
        soft_wrap=True,
    )
    for failure in outcome.failures[:10]:
        console.print(f"[red]not evaluated[/red]: {escape(failure)}", soft_wrap=True)
    _log_wandb(config, summary, console)
    return 1 if outcome.failures else 0


def _log_wandb(config: Any, summary: dict[str, Any], console: Console) -> None:
    from kernelrl.launch.wandb_log import log_sweep, wants_wandb

    if wants_wandb(config.report_to):
        run_dir = log_sweep(config.output_dir, summary, config.to_dict())
        console.print(f"wandb run: {run_dir}", soft_wrap=True)


def _quietly(close: Any) -> None:
    """Close a client or pool after a stop; a second Ctrl-C while closing is not a traceback."""
    with contextlib.suppress(KeyboardInterrupt):
        close()


def _compare(words: list[str]) -> int:
    from kernelrl.eval.compare import compare_markdown, compare_runs, print_comparison

    parser = argparse.ArgumentParser(
        prog="kernelrl eval compare", description="two sweeps side by side"
    )
    parser.add_argument("run_a", help="results folder of run A")
    parser.add_argument("run_b", help="results folder of run B")
    parser.add_argument(
        "--view", choices=["best", "last"], default="best", help="which turn of each sample"
    )
    parser.add_argument("--output", default="", help="also write the comparison as markdown")
    args = parser.parse_args(words)
    comparison = compare_runs(args.run_a, args.run_b, args.view)
    print_comparison(comparison, Console())
    if args.output:
        Path(args.output).write_text(compare_markdown(comparison))
    return 0


def _report(words: list[str]) -> int:
    from kernelrl.eval.report import print_summary, write_report

    parser = argparse.ArgumentParser(
        prog="kernelrl eval report", description="rebuild a run's report"
    )
    parser.add_argument("run", help="results folder")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(words)
    summary = write_report(args.run, plots=not args.no_plots)
    print_summary(summary, Console())
    print(Path(args.run) / "report.md")
    return 0
