"""``kernelrl curate``: dataset curation from a recipe.

    kernelrl curate --config recipes/curate/smoke_cpu.yaml [--key value ...]

Recipes are flat YAML files parsed the TRL way (``trl.TrlParser`` over
``kernelrl.data.curate.config.CURATE_RECIPE``: ``CurateConfig`` and each step's own keys):
YAML keys set the defaults, ``--key value`` flags override them. The subparser takes every
word after ``curate`` verbatim (``launch.recipe.add_recipe_command``) because only the recipe's
dataclasses know the flags. A missing or malformed recipe, an unknown key or a bad value is one
line on stderr and exit code 2 (``ValueError`` handled by ``kernelrl.launch.cli.main``).

Tables, progress bars and logs go to stderr (as for ``kernelrl eval``). Ctrl-C ends with one
line saying what was kept under ``output_dir/.curate_state`` and exit status 130; the same
command resumes from there (finished steps are loaded, journaled records are not rerun).

Model handling lives here, not in ``kernelrl.data`` (dependency arrows): with
``pass_rate_model`` set (a key of the difficulty step), the model name is resolved
(``launch.models``) and a generation client from ``kernelrl.eval.clients`` produces the k
samples per task.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from kernelrl.launch.recipe import add_recipe_command, parse_recipe

USAGE = """usage: kernelrl curate --config RECIPE.yaml [--key value ...]

Every recipe key can be given as a flag (--output_dir runs/x --steps normalize dedup);
`kernelrl curate --help` lists them."""


def add_subcommand(commands: Any) -> None:
    add_recipe_command(
        commands,
        "curate",
        help="curate datasets: validate, dedup, decontaminate, tag, select SFT data",
        run=_curate,
        recipe_types=_recipe_types,
        usage=USAGE,
    )


def _recipe_types() -> tuple[type, ...]:
    from kernelrl.data.curate.config import CURATE_RECIPE

    return CURATE_RECIPE


def make_generate(config: Any) -> tuple[Any, Any]:
    """(generate(prompts, k) -> k completions per prompt, client) for the pass-rate model of a
    composed ``CurateConfig`` (its ``difficulty`` part; samples seeded from the run's ``seed``)."""
    from kernelrl.eval.clients import Request, Sampling, TransformersClient, VLLMClient
    from kernelrl.launch.models import resolve_model

    keys = config.difficulty
    model = resolve_model(keys.pass_rate_model)
    sampling = Sampling(keys.pass_rate_temperature, 1.0, keys.pass_rate_max_new_tokens)
    if keys.pass_rate_client == "transformers":
        client = TransformersClient(model, sampling)
    elif keys.pass_rate_client == "vllm":
        client = VLLMClient(model, sampling, seed=config.seed)
    else:
        raise ValueError(
            f"pass_rate_client must be transformers or vllm, got {keys.pass_rate_client!r}"
        )

    def generate(prompts: Sequence[list[dict[str, str]]], k: int) -> list[list[str]]:
        requests = [
            Request(
                task_id=str(i),
                sample=j,
                turn=0,
                messages=list(prompt),
                seed=config.seed * 1_000_003 + i * k + j,
            )
            for i, prompt in enumerate(prompts)
            for j in range(k)
        ]
        texts = [g.text for g in client.generate(requests)]
        return [texts[i * k : (i + 1) * k] for i in range(len(prompts))]

    return generate, client


def _curate(words: list[str]) -> int:
    import datasets
    from rich.console import Console

    from kernelrl.data.curate.config import compose_recipe
    from kernelrl.data.curate.pipeline import CurationInterrupted, run_curation

    datasets.disable_progress_bars()  # the step tables and our progress bars say what happens

    config = compose_recipe(parse_recipe(words, _recipe_types(), "kernelrl curate"))
    # Tables, progress and logs on stderr, as `kernelrl eval` does; stdout stays for data.
    console = Console(stderr=True)
    generate, client = None, None
    try:
        if config.difficulty.pass_rate_model:
            generate, client = make_generate(config)
        result = run_curation(
            config, generate=generate, console=console, command="kernelrl curate " + " ".join(words)
        )
    except CurationInterrupted as exc:
        print(f"kernelrl curate: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before the first step (loading a model, reading sources)
        print(
            "kernelrl curate: interrupted before any step finished; nothing to resume",
            file=sys.stderr,
        )
        return 130
    finally:
        if client is not None:
            client.close()
    console.print(f"dataset card: {result.card}")
    from kernelrl.launch.wandb_log import log_curation, wants_wandb

    if wants_wandb(config.report_to):
        name = os.path.basename(os.path.normpath(config.output_dir)) or "curate"
        run_dir = log_curation(config.output_dir, result.reports, config.to_dict(), name)
        console.print(f"wandb run: {run_dir}", soft_wrap=True)
    return 0
