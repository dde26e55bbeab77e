"""Recipes: one flat YAML file (``--config FILE``) plus ``--key value`` overrides, parsed by
TRL's ``TrlParser`` into the command's dataclasses. Every command reads its recipe here, so a
bad recipe gets the same one-line error everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelrl.launch.errors import check_folder_path


class RecipeError(ValueError):
    """A recipe that cannot be used: missing file, malformed YAML, unknown key, bad value."""


def parse_recipe(words: list[str], dataclass_types: tuple[type, ...], prog: str) -> tuple[Any, ...]:
    """The dataclasses, filled from the recipe and the flags (``-h`` prints help and exits 0);
    ``RecipeError`` with one line for anything that cannot be used."""
    import yaml
    from trl import TrlParser

    parser = TrlParser(dataclass_types, prog=prog)
    if "-h" in words or "--help" in words:
        parser.print_help()
        raise SystemExit(0)
    if "--config" in words:
        index = words.index("--config")
        if index + 1 >= len(words):
            raise RecipeError("--config needs a recipe file")
        path = Path(words[index + 1])
        if not path.is_file():
            raise RecipeError(f"recipe {path} does not exist")
    try:
        parsed = tuple(parser.parse_args_and_config(list(words)))
    except yaml.YAMLError as exc:
        raise RecipeError(f"malformed YAML in recipe: {' '.join(str(exc).split())}") from exc
    except OSError as exc:
        raise RecipeError(f"cannot read recipe: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise RecipeError(" ".join(str(exc).split())) from exc
    except SystemExit as exc:  # argparse: a flag it cannot parse (message already printed)
        if exc.code:
            raise RecipeError(
                f"bad command-line flags for `{prog}` (see the message above)"
            ) from None
        raise
    # Before anything runs: a file where the results folder should be is refused, untouched.
    for config in parsed:
        if getattr(config, "output_dir", None):
            check_folder_path(config.output_dir, "output_dir")
    return parsed


def resume_argument(value: str | bool | None) -> str | bool | None:
    """``resume_from_checkpoint`` as ``Trainer.train`` takes it: a checkpoint folder, True for
    the latest checkpoint in ``output_dir`` (``true`` / ``latest`` in a recipe), or None."""
    if isinstance(value, str) and value.lower() in ("true", "latest"):
        return True
    if isinstance(value, str) and value.lower() in ("", "false", "none"):
        return None
    return value or None
