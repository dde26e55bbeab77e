"""The configuration of a curation run: several dataclasses, one flat recipe.

As for training (``kernelrl.rl.config``), a recipe (``recipes/curate/*.yaml``) is one flat YAML
parsed by ``trl.TrlParser`` into several dataclasses at once (``CURATE_RECIPE``), every key
overridable with ``--key value``: ``CurateConfig`` (sources, steps, seed, the pool and its device) and
each step's own keys, defined next to the step (``ValidateConfig``, ``DedupConfig``,
``DecontaminateConfig``, ``DifficultyConfig``, ``SelectConfig``, ``RevisionConfig``).
``CurateConfig.compose`` hangs the parsed parts on the run's config (``config.validate``,
``config.dedup``, ...), so the pipeline hands each step its own part and no value is copied
from one config into another; ``config.to_dict()`` (``recipe.json``, the wandb run's config)
holds every part's keys. ``curate_config(**keys)`` does the same from a flat mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from kernelrl.data.curate.decontaminate import DecontaminateConfig
from kernelrl.data.curate.dedup import DedupConfig
from kernelrl.data.curate.difficulty import DifficultyConfig
from kernelrl.data.curate.sft_select import SelectConfig
from kernelrl.data.curate.trajectories_to_sft import RevisionConfig
from kernelrl.data.curate.validate_config import ValidateConfig
from kernelrl.env.pools import EnvPoolConfig

STEPS = ("normalize", "dedup", "decontaminate", "validate", "difficulty", "sft")


@dataclass
class CurateConfig(EnvPoolConfig):
    """What a curation run reads, which steps it runs and where; the steps' own keys are parsed
    next to it (``CURATE_RECIPE``) and hung on it by ``compose``."""

    output_dir: str = field(
        default="", metadata={"help": "where the datasets, card and reports go"}
    )
    name: str = field(default="kernelrl-curated", metadata={"help": "dataset name in the card"})
    task_sources: list[str] = field(
        default_factory=list, metadata={"help": "FORMAT:PATH or {format, path, fields, ...}"}
    )
    sample_sources: list[str] = field(
        default_factory=list, metadata={"help": "generated samples (task_id, completion)"}
    )
    trajectory_sources: list[str] = field(
        default_factory=list, metadata={"help": "multi-turn trajectories"}
    )
    benchmark_sources: list[str] = field(
        default_factory=list, metadata={"help": "evaluation sets to decontaminate against"}
    )
    steps: list[str] = field(
        default_factory=lambda: list(STEPS), metadata={"help": f"subset of {STEPS}"}
    )
    backend: str | None = field(
        default=None, metadata={"help": "override every task's backend (triton | cuda)"}
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "prompt template file ($reference, $backend_name, $example, ...)"},
    )
    one_shot: bool = field(
        default=True, metadata={"help": "include the backend's one-shot example in task prompts"}
    )
    seed: int = field(
        default=0,
        metadata={"help": "seeds of validation runs and pass-rate samples derive from it"},
    )
    report_to: list[str] = field(
        default_factory=list,
        metadata={"help": "wandb: log step counts and the card (offline unless WANDB_API_KEY)"},
    )
    # evaluation of samples, trajectory turns and pass-rate samples, through the pool (the
    # other pool keys: ``EnvPoolConfig``)
    env_workers: int | None = field(
        default=2, metadata={"help": "CPU slots or GPUs of the pool made for these evaluations"}
    )

    # ------------------------------------------------------------------ composed parts
    # Parsed as their own dataclasses next to this one (CURATE_RECIPE); set by ``compose``.
    validate: ValidateConfig = field(default_factory=ValidateConfig, init=False, repr=False)
    dedup: DedupConfig = field(default_factory=DedupConfig, init=False, repr=False)
    decontaminate: DecontaminateConfig = field(
        default_factory=DecontaminateConfig, init=False, repr=False
    )
    difficulty: DifficultyConfig = field(default_factory=DifficultyConfig, init=False, repr=False)
    sft: SelectConfig = field(default_factory=SelectConfig, init=False, repr=False)
    revision: RevisionConfig = field(default_factory=RevisionConfig, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in (
            "task_sources",
            "sample_sources",
            "trajectory_sources",
            "benchmark_sources",
            "steps",
        ):
            value = getattr(self, name)
            if isinstance(value, str):  # one value given on the command line
                setattr(self, name, [value])
        unknown = set(self.steps) - set(STEPS)
        if unknown:
            raise ValueError(
                f"unknown curation steps {sorted(unknown)} (known: {', '.join(STEPS)})"
            )

    def compose(
        self,
        validate: ValidateConfig,
        dedup: DedupConfig,
        decontaminate: DecontaminateConfig,
        difficulty: DifficultyConfig,
        sft: SelectConfig,
        revision: RevisionConfig,
    ) -> CurateConfig:
        """Hang the steps' parts parsed next to this config on it (``CURATE_RECIPE``'s order)."""
        self.validate, self.dedup, self.decontaminate = validate, dedup, decontaminate
        self.difficulty, self.sft, self.revision = difficulty, sft, revision
        return self

    def parts(self) -> tuple[Any, ...]:
        """The steps' parts, in ``CURATE_RECIPE``'s order."""
        return (
            self.validate,
            self.dedup,
            self.decontaminate,
            self.difficulty,
            self.sft,
            self.revision,
        )

    def to_dict(self) -> dict[str, Any]:
        """Every recipe key of the run and of its parts: a flat recipe that reruns it."""
        return {
            f.name: getattr(part, f.name)
            for part in (self, *self.parts())
            for f in fields(part)
            if f.init
        }


#: The dataclasses a curation recipe is parsed into, in the order the parser returns them.
CURATE_RECIPE = (
    CurateConfig,
    ValidateConfig,
    DedupConfig,
    DecontaminateConfig,
    DifficultyConfig,
    SelectConfig,
    RevisionConfig,
)


def compose_recipe(parsed: tuple[Any, ...]) -> CurateConfig:
    """The run's config with its parts, from what the parser returns for ``CURATE_RECIPE``."""
    config, *parts = parsed
    return config.compose(*parts)


def curate_config(**keys: Any) -> CurateConfig:
    """``CurateConfig`` with its parts, from the flat keys a recipe would hold (TRL's parser
    splits them between the dataclasses; a key none of them knows is an error)."""
    from trl import TrlParser

    return compose_recipe(tuple(TrlParser(CURATE_RECIPE).parse_dict(keys)))
