"""kernelrl.eval: evaluation sweeps on KernelBench and kernelrl's own suites.

- ``config``: ``EvalSweepConfig``, the flat dataclass a recipe fills;
- ``benchmarks``: KernelBench (checkout or HF dataset), task folders, selection;
- ``clients`` / ``fixed``: vLLM, OpenAI-compatible, transformers, replayed completions;
- ``sweep``: generation -> environment -> ``samples.jsonl`` (resumable), turn by turn;
- ``metrics``, ``report``, ``plots``, ``compare``: numbers, markdown, figures, A/B tables.
"""
