"""Recipes: one flat YAML file (``--config FILE``) plus ``--key value`` overrides, parsed by
TRL's ``TrlParser`` into the command's dataclasses. Every command reads its recipe here, so a
bad recipe gets the same one-line error everywhere, and every recipe command is registered here
(``add_recipe_command``), so each one takes its words, shows its help and its usage alike."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from kernelrl.launch.errors import check_folder_path


class RecipeError(ValueError):
    """A recipe that cannot be used: missing file, malformed YAML, unknown key, bad value."""


class _OneLineParser:
    """Mixin: argparse's ``error`` (usage text, then exit 2) becomes a one-line RecipeError."""

    def error(self, message: str) -> NoReturn:  # argparse's hook for every parse error
        raise RecipeError(" ".join(message.split()))


def recipe_parser(dataclass_types: tuple[type, ...], prog: str, for_help: bool = False) -> Any:
    """TRL's parser over ``dataclass_types`` whose errors are one line. ``for_help``: one that
    also lists ``--config`` (TrlParser takes the flag before parsing, so it cannot be an
    argument of the parser that builds the dataclasses)."""
    from trl import TrlParser

    parser_type = type("RecipeParser", (_OneLineParser, TrlParser), {})
    parser = parser_type(dataclass_types, prog=prog)
    if for_help:
        group = parser.add_argument_group("recipe")
        group.add_argument(
            "--config",
            metavar="RECIPE.yaml",
            help="flat YAML recipe: its keys set the defaults; --key value flags override them",
        )
    return parser


def print_recipe_help(
    dataclass_types: tuple[type, ...], prog: str, usage_printed: bool = False
) -> None:
    """Every key of the recipe's dataclasses, ``--config`` first, then kernelrl's own keys
    under one heading per part, then the keys kernelrl inherits from TRL and transformers under
    theirs: a training recipe has some 300 keys, and TrainingArguments' hundreds came first."""
    parser = recipe_parser(dataclass_types, prog, for_help=True)
    # argparse's own usage line lists every key (250 lines for training)
    parser.usage = (
        argparse.SUPPRESS if usage_printed else "%(prog)s --config RECIPE.yaml [--key value ...]"
    )
    group_recipe_keys(parser, dataclass_types)
    parser.print_help()


def _declared_by(kind: type, name: str) -> type:
    """The class of ``kind``'s MRO that declares field ``name`` (a key of TrainingArguments
    stays transformers' when KernelGRPOConfig inherits it)."""
    for cls in kind.__mro__:
        if name in cls.__dict__.get("__annotations__", {}):
            return cls
    return kind


def _heading(kind: type, declared: type) -> tuple[str, str | None]:
    """(title, description) of a key's group: kernelrl's parts by the part they belong to,
    inherited keys by the library class that declares them."""
    library = declared.__module__.split(".")[0]
    if library == "kernelrl":
        doc = " ".join((kind.__doc__ or "").split(". ")[0].split())
        return f"kernelrl: {kind.__name__}", (doc.rstrip(".") + ".") if doc else None
    if declared.__name__.startswith("_"):  # a library's private base: its nearest public heir
        below = kind.__mro__[: kind.__mro__.index(declared)]
        public = [c for c in below if c.__module__.split(".")[0] == library]
        declared = next((c for c in reversed(public) if not c.__name__.startswith("_")), declared)
    return f"{library}: {declared.__name__}", None


def group_recipe_keys(parser: argparse.ArgumentParser, dataclass_types: tuple[type, ...]) -> None:
    """Move every key's option into the group of its part (``_heading``), kernelrl's groups
    first. Only the help text changes: parsing does not look at groups."""
    owners: dict[str, type] = {}
    for kind in dataclass_types:
        for name in getattr(kind, "__dataclass_fields__", {}):
            owners.setdefault(name, kind)
    ours: dict[str, argparse._ArgumentGroup] = {}
    theirs: dict[str, argparse._ArgumentGroup] = {}
    for action in list(parser._actions):
        kind = owners.get(action.dest)
        if kind is None:  # -h and --config keep their places
            continue
        title, description = _heading(kind, _declared_by(kind, action.dest))
        groups = ours if title.startswith("kernelrl: ") else theirs
        if title not in groups:
            groups[title] = parser.add_argument_group(title, description)
        for group in parser._action_groups:
            if action in group._group_actions:
                group._group_actions.remove(action)
        groups[title]._group_actions.append(action)
    rest = [g for g in parser._action_groups if g not in (*ours.values(), *theirs.values())]
    parser._action_groups = [*rest, *ours.values(), *theirs.values()]


def add_verbatim_command(
    commands: Any,
    name: str,
    help: str,
    handler: Callable[[list[str]], int],
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand that hands every word after its name to ``handler`` as it is: its flags
    belong to a parser argparse cannot know (a recipe's dataclasses, vLLM's server), so the
    subparser has no options of its own (prefix character ``+``, no ``-h``)."""
    parser = commands.add_parser(
        name, help=help, description=description, prefix_chars="+", add_help=False
    )
    parser.add_argument("words", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=lambda args: handler(list(args.words)))
    return parser


def add_recipe_command(
    commands: Any,
    name: str,
    help: str,
    run: Callable[[list[str]], int],
    recipe_types: Callable[[], tuple[type, ...]],
    usage: str | None = None,
) -> argparse.ArgumentParser:
    """Registers a command run from a recipe (``--config FILE`` plus ``--key value`` flags),
    the same way for every such command: ``-h`` / ``--help`` as the first word prints
    ``usage`` and every key of ``recipe_types()`` (imported only then: TRL is slow to import),
    ``--config`` first; no words prints ``usage`` on stderr with exit status 2 (the keys, exit
    0, for a command without a usage text); a leading ``--`` (``accelerate launch -m
    kernelrl.launch.cli train -- --config ...``) is dropped. Anything else goes to ``run``,
    which parses the recipe with :func:`parse_recipe`."""

    def handle(words: list[str]) -> int:
        if words[:1] == ["--"]:
            words = words[1:]
        if not words and usage:
            print(usage, file=sys.stderr)
            return 2
        if not words or words[0] in ("-h", "--help"):
            if usage:
                print(usage + "\n")
            print_recipe_help(recipe_types(), parser.prog, usage_printed=bool(usage))
            return 0
        return run(words)

    parser = add_verbatim_command(commands, name, help, handle, description=usage)
    return parser


def _known_keys(parser: Any) -> set[str]:
    return {action.dest for action in parser._actions} | {"env"}


def check_keys(parser: Any, recipe: dict[str, Any], words: list[str], prog: str) -> None:
    """``RecipeError`` naming every recipe key and ``--flag`` that no dataclass of ``prog``
    knows, with the closest known key; before any dataclass is built."""
    import difflib

    known = _known_keys(parser)
    flags = {o for action in parser._actions for o in action.option_strings} | {"--config"}
    unknown = [str(k) for k in recipe if str(k) not in known]
    for word in words:
        name = word.split("=", 1)[0]
        # argparse takes a unique prefix of a flag; anything else is a typo
        if (
            name.startswith("--")
            and name not in flags
            and len([f for f in flags if f.startswith(name)]) != 1
        ):
            unknown.append(name)
    if not unknown:
        return
    renamed = {
        old: new
        for kind in getattr(parser, "dataclass_types", ())
        for old, new in getattr(kind, "RENAMED_KEYS", {}).items()
    }
    for key in unknown:
        if key.lstrip("-") in renamed:
            raise RecipeError(
                f"{key.lstrip('-')} was replaced by {renamed[key.lstrip('-')]}: rename it in the "
                f"recipe (`{prog} --help` lists every key)"
            )
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key.lstrip("-"), sorted(known), n=1)
        hints.append(f"{key} (did you mean {close[0]}?)" if close else key)
    raise RecipeError(
        f"unknown key{'s' if len(unknown) > 1 else ''} for `{prog}`: {', '.join(hints)}; "
        f"`{prog} --help` lists every key"
    )


def parse_recipe(words: list[str], dataclass_types: tuple[type, ...], prog: str) -> tuple[Any, ...]:
    """The dataclasses, filled from the recipe and the flags (``-h`` prints help and exits 0);
    ``RecipeError`` with one line for anything that cannot be used."""
    import yaml

    if "-h" in words or "--help" in words:
        print_recipe_help(dataclass_types, prog)
        raise SystemExit(0)
    parser = recipe_parser(dataclass_types, prog)
    recipe: dict[str, Any] = {}
    if "--config" in words:
        index = words.index("--config")
        if index + 1 >= len(words):
            raise RecipeError("--config needs a recipe file")
        path = Path(words[index + 1])
        if not path.is_file():
            raise RecipeError(f"recipe {path} does not exist")
        try:
            recipe = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise RecipeError(f"malformed YAML in recipe: {' '.join(str(exc).split())}") from exc
        except OSError as exc:
            raise RecipeError(f"cannot read recipe: {exc}") from exc
        if not isinstance(recipe, dict):
            raise RecipeError(f"recipe {path} must be a YAML mapping of keys to values")
    # Unknown keys first: building the dataclasses runs their checks (TrainingArguments refuses
    # bf16 on a CPU), which would hide the typo that is the real mistake.
    check_keys(parser, recipe, words, prog)
    user_environment = dict(os.environ)
    try:
        parsed = tuple(parser.parse_args_and_config(list(words)))
    except yaml.YAMLError as exc:
        raise RecipeError(f"malformed YAML in recipe: {' '.join(str(exc).split())}") from exc
    except OSError as exc:
        raise RecipeError(f"cannot read recipe: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise RecipeError(" ".join(str(exc).split())) from exc
    keep_user_environment(user_environment, recipe.get("env"))
    # Before anything runs: a file where the results folder should be is refused, untouched.
    for config in parsed:
        if getattr(config, "output_dir", None):
            check_folder_path(config.output_dir, "output_dir")
    return parsed


def keep_user_environment(before: dict[str, str], recipe_env: Any) -> list[str]:
    """A recipe's ``env:`` gives defaults: TRL's parser sets every variable it names, so a
    variable the user had set (``HF_HUB_OFFLINE=0`` to use the hub, ``WANDB_MODE``) is put
    back. Returns the names put back."""
    if not isinstance(recipe_env, dict):
        return []
    kept = []
    for key in map(str, recipe_env):
        if key in before and os.environ.get(key) != before[key]:
            os.environ[key] = before[key]
            kept.append(key)
    return kept


def resume_argument(
    value: str | bool | None, output_dir: str, rank_files: Sequence[str] = ()
) -> str | None:
    """``resume_from_checkpoint`` as ``Trainer.train`` takes it: a checkpoint folder, or None.

    ``true`` / ``latest`` is the newest *complete* checkpoint in ``output_dir``, not the
    Trainer's newest folder: a run killed while saving (a rank lost mid-checkpoint) leaves a
    folder that the Trainer would pick and then fail to read. ``rank_files`` are files every
    rank writes last into a checkpoint (``{rank}`` in the name)."""
    if value is True or (isinstance(value, str) and value.lower() in ("true", "latest")):
        found = last_complete_checkpoint(output_dir, rank_files)
        if found is None:
            partial = sorted(p.name for p in Path(output_dir).glob("checkpoint-*"))
            why = f" ({', '.join(partial)}: left incomplete by a run stopped while saving)"
            raise RecipeError(
                f"resume_from_checkpoint={value}: no complete checkpoint in {output_dir}"
                f"{why if partial else ''}; start again without resume_from_checkpoint"
            )
        return found
    if not value or (isinstance(value, str) and value.lower() in ("false", "none")):
        return None
    return str(value)


def last_complete_checkpoint(
    output_dir: str, rank_files: Sequence[str] = (), world_size: int | None = None
) -> str | None:
    """The highest-numbered ``checkpoint-N`` holding the Trainer's state (written after the
    weights and optimizer) and, for every rank (``world_size``, default this run's
    ``WORLD_SIZE``), its random state and each of ``rank_files``; None when there is none."""
    world = world_size or int(os.environ.get("WORLD_SIZE", "1"))
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.name[11:].isdigit()]
    for folder in sorted(folders, key=lambda p: int(p.name[11:]), reverse=True):
        names = {p.name for p in folder.iterdir()}
        per_rank = list(rank_files)
        if any(n.startswith("rng_state") for n in names):  # absent with save_only_model
            per_rank.append("rng_state_{rank}.pth" if world > 1 else "rng_state.pth")
        if "trainer_state.json" in names and all(
            f.format(rank=r) in names for f in per_rank for r in range(world)
        ):
            return str(folder)
    return None
