"""The recipe of a synthetic-task run: ``SynthConfig`` plus the curation steps' own parts.

As for ``kernelrl curate`` (``kernelrl.data.curate.config``), one flat YAML is parsed by
``trl.TrlParser`` into several dataclasses (``SYNTH_RECIPE``): the generator's keys here, and
the keys of the curation steps it reuses (dedup, decontamination, sandbox validation, SFT
selection), defined next to those steps. ``compose`` hangs the parts on the run's config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from kernelrl.data.curate.decontaminate import DecontaminateConfig
from kernelrl.data.curate.dedup import DedupConfig
from kernelrl.data.curate.sft_select import SelectConfig
from kernelrl.data.curate.validate_config import ValidateConfig
from kernelrl.data.synth.graph import ALL_FAMILIES, DTYPES, FAMILIES, PROFILES, DrawConfig, Graph
from kernelrl.env.pools import EnvPoolConfig


@dataclass
class SynthConfig(EnvPoolConfig):
    """What the generator draws, how much of it is run in the sandbox, and where it goes."""

    output_dir: str = field(
        default="", metadata={"help": "where the splits, SFT rows and reports go"}
    )
    name: str = field(default="kernelrl-synthetic", metadata={"help": "dataset name in the card"})
    num_tasks: int = field(
        default=10_000,
        metadata={"help": "tasks to generate (drawn until this many pass the checks)"},
    )
    seed: int = field(default=0, metadata={"help": "everything drawn derives from it"})
    size_profile: str = field(
        default="cuda",
        metadata={
            "help": "sizes in the module globals: cuda (KernelBench-like) or cpu (interpreter)"
        },
    )
    families: list[str] = field(
        default_factory=lambda: list(FAMILIES),
        metadata={"help": f"task families, of {ALL_FAMILIES} (default: {FAMILIES})"},
    )
    family_weights: list[float] = field(
        default_factory=list, metadata={"help": "one weight per family (empty: equal)"}
    )
    dtypes: list[str] = field(
        default_factory=lambda: list(DTYPES), metadata={"help": f"dtypes, of {DTYPES}"}
    )
    dtype_weights: list[float] = field(
        default_factory=lambda: [0.6, 0.25, 0.15], metadata={"help": "one weight per dtype"}
    )
    max_pointwise: int = field(default=4, metadata={"help": "most pointwise operators per task"})
    rank3_share: float = field(default=0.3, metadata={"help": "share of tasks with 3-d inputs"})
    max_attempts_factor: float = field(
        default=3.0, metadata={"help": "stop drawing after num_tasks * this many graphs"}
    )
    heldout_share: float = field(
        default=0.1, metadata={"help": "share of tasks in held-out combinations"}
    )
    validation_share: float = field(
        default=0.05, metadata={"help": "share of tasks in validation combinations"}
    )
    benchmark_sources: list[str] = field(
        default_factory=list, metadata={"help": "benchmarks to decontaminate against (KernelBench)"}
    )
    backend: str = field(default="triton", metadata={"help": "backend named in the prompts"})
    one_shot: bool = field(default=False, metadata={"help": "one-shot example in the prompts"})
    prompt_template: str | None = field(default=None, metadata={"help": "prompt template file"})
    env_device: str = field(
        default="cpu", metadata={"help": "cpu | cuda | auto: where sandbox runs and evaluations go"}
    )
    sandbox_sample: int = field(
        default=24, metadata={"help": "seeded sample of tasks validated in the sandbox"}
    )
    validate_candidates: bool = field(
        default=True,
        metadata={
            "help": "also run every reference candidate's task twice in the sandbox; false "
            "leaves that to its reference solution's evaluation, which runs the task too"
        },
    )
    reference_solutions: int = field(
        default=20,
        metadata={"help": "training tasks given a Triton reference (kept only if judged correct)"},
    )
    reference_max_pointwise: int = field(
        default=0,
        metadata={
            "help": "reference solutions only for chains of at most this many pointwise "
            "operators, validation and held-out only from longer ones (0: no such tier)"
        },
    )
    env_workers: int | None = field(
        default=2, metadata={"help": "CPU slots or GPUs of the evaluation pool"}
    )

    validate: ValidateConfig = field(default_factory=ValidateConfig, init=False, repr=False)
    dedup: DedupConfig = field(default_factory=DedupConfig, init=False, repr=False)
    decontaminate: DecontaminateConfig = field(
        default_factory=DecontaminateConfig, init=False, repr=False
    )
    sft: SelectConfig = field(default_factory=SelectConfig, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("families", "dtypes", "benchmark_sources"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, [getattr(self, name)])
        if self.size_profile not in PROFILES:
            raise ValueError(
                f"size_profile must be one of {tuple(PROFILES)}, got {self.size_profile!r}"
            )
        for name, known in (("families", ALL_FAMILIES), ("dtypes", DTYPES)):
            unknown = set(getattr(self, name)) - set(known)
            if unknown or not getattr(self, name):
                raise ValueError(
                    f"{name} must be a non-empty subset of {known}, got {getattr(self, name)}"
                )
        if self.family_weights and len(self.family_weights) != len(self.families):
            raise ValueError("family_weights needs one weight per family")
        if len(self.dtype_weights) != len(self.dtypes):
            raise ValueError("dtype_weights needs one weight per dtype")
        if not 0 <= self.heldout_share + self.validation_share < 1:
            raise ValueError("heldout_share + validation_share must lie in [0, 1)")
        if self.num_tasks < 1 or self.max_pointwise < 1:
            raise ValueError("num_tasks and max_pointwise must be at least 1")
        if not 0 <= self.reference_max_pointwise < self.max_pointwise:
            raise ValueError(
                "reference_max_pointwise must lie in [0, max_pointwise): the evaluation splits "
                f"need longer chains, got {self.reference_max_pointwise} of {self.max_pointwise}"
            )

    @property
    def eval_min_pointwise(self) -> int:
        """The shortest chain the evaluation splits may hold: one past the reference tier."""
        return self.reference_max_pointwise + 1 if self.reference_max_pointwise else 0

    def in_reference_tier(self, graph: Graph) -> bool:
        return not self.reference_max_pointwise or graph.pointwise <= self.reference_max_pointwise

    def draw_config(self) -> DrawConfig:
        weights = self.family_weights or [1.0] * len(self.families)
        return DrawConfig(
            families=dict(zip(self.families, weights, strict=True)),
            dtypes=dict(zip(self.dtypes, self.dtype_weights, strict=True)),
            max_pointwise=self.max_pointwise,
            rank3_share=self.rank3_share,
        )

    def compose(
        self,
        validate: ValidateConfig,
        dedup: DedupConfig,
        decontaminate: DecontaminateConfig,
        sft: SelectConfig,
    ) -> SynthConfig:
        self.validate, self.dedup, self.decontaminate, self.sft = (
            validate,
            dedup,
            decontaminate,
            sft,
        )
        return self

    def to_dict(self) -> dict[str, Any]:
        """Every recipe key of the run and its parts: a flat recipe that reruns it."""
        parts = (self, self.validate, self.dedup, self.decontaminate, self.sft)
        return {f.name: getattr(p, f.name) for p in parts for f in fields(p) if f.init}


#: The dataclasses a synthetic-task recipe is parsed into, in the parser's order.
SYNTH_RECIPE = (SynthConfig, ValidateConfig, DedupConfig, DecontaminateConfig, SelectConfig)


def synth_config(**keys: Any) -> SynthConfig:
    """``SynthConfig`` with its parts from the flat keys a recipe would hold."""
    from trl import TrlParser

    config, *parts = TrlParser(SYNTH_RECIPE).parse_dict(keys)
    return config.compose(*parts)
