"""``kernelrl synth``: synthetic KernelBench-format tasks and verified SFT references.

    kernelrl synth --config recipes/synth/synthetic_cpu.yaml [--key value ...]

A recipe command like ``kernelrl curate`` (``launch.recipe``): flat YAML parsed by TRL's
parser into ``kernelrl.data.synth.config.SYNTH_RECIPE``; an unknown key or a bad value is one
line on stderr and exit status 2. Progress bars and tables go to stderr.
"""

from __future__ import annotations

from typing import Any

from kernelrl.launch.recipe import add_recipe_command, parse_recipe

USAGE = """usage: kernelrl synth --config RECIPE.yaml [--key value ...]

Generates tasks from operator graphs, curates them (dedup, decontamination, difficulty),
splits them by operator combination, validates a seeded sample in the sandbox and writes
reference Triton solutions that the environment judged correct as SFT rows.
`kernelrl synth --help` lists every key."""


def add_subcommand(commands: Any) -> None:
    add_recipe_command(
        commands,
        "synth",
        help="generate synthetic tasks from operator graphs, with verified reference solutions",
        run=_synth,
        recipe_types=_recipe_types,
        usage=USAGE,
    )


def _recipe_types() -> tuple[type, ...]:
    from kernelrl.data.synth.config import SYNTH_RECIPE

    return SYNTH_RECIPE


def _synth(words: list[str]) -> int:
    import datasets
    from rich.console import Console

    from kernelrl.data.synth.pipeline import run_synthesis

    datasets.disable_progress_bars()
    config, *parts = parse_recipe(words, _recipe_types(), "kernelrl synth")
    config = config.compose(*parts)
    console = Console(stderr=True)
    result = run_synthesis(config, console=console, command="kernelrl synth " + " ".join(words))
    console.print(f"summary: {result.output_dir / 'summary.json'}")
    return 0
