"""Synthetic KernelBench-format tasks composed from a typed operator graph (``graph``), rendered
as tasks (``render``) and as fused Triton reference solutions (``triton_ref``), checked
(``check``), split by operator combination (``split``) and curated with ``kernelrl.data.curate``'s
steps (``pipeline``); ``kernelrl synth`` runs it from a recipe (``config``)."""
