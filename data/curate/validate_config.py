"""The validate step's recipe keys, apart from the step itself: the prober and the verdict read
them, and the step imports both, so the keys live where all three can import them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernelrl.env.timing import TimingConfig


@dataclass
class ValidateConfig:
    """The validate step's recipe keys (parsed next to ``CurateConfig``, whose ``device`` and
    ``seed`` the step runs with)."""

    validate_workers: int = field(default=2, metadata={"help": "sandboxed runs in flight"})
    validate_timeout_s: float = field(
        default=120.0,
        metadata={"help": "wall clock for one sandboxed run (load, calls, timing)"},
    )
    max_ref_runtime_ms: float | None = field(
        default=None, metadata={"help": "reference runtime budget on the device"}
    )
    reject_constant_outputs: bool = field(
        default=True,
        metadata={"help": "remove references whose outputs do not depend on their inputs"},
    )
    # Fixed settings, not recipe keys.
    gpu_index: int = field(default=0, init=False)
    num_input_sets: int = field(default=2, init=False)
    host_memory_bytes: int = field(default=8 * 2**30, init=False)
    timing: TimingConfig = field(default_factory=TimingConfig, init=False)

    def verdict_settings(self, device: str, seed: int) -> dict[str, Any]:
        """The settings a verdict depends on, which key the journal: a rerun with more or fewer
        workers resumes where the last one stopped. The names are those the journals of earlier
        runs were keyed with (renaming one would make every such journal unusable)."""
        return {
            "device": device,
            "gpu_index": self.gpu_index,
            "timeout_s": self.validate_timeout_s,
            "max_runtime_ms": self.max_ref_runtime_ms,
            "num_input_sets": self.num_input_sets,
            "seed": seed,
            "host_memory_bytes": self.host_memory_bytes,
            "reject_constant_outputs": self.reject_constant_outputs,
            # The procedure's version too, as cached reference timings are keyed.
            "timing": self.timing.settings(),
        }
