"""A sweep's completions without its judging: ``kernelrl eval``'s flags, its prompts, its
per-sample seeds and its generation client, and ``OUTPUT_DIR/completions.jsonl`` instead of
judged samples.

Why: the learning benchmark's models live on a GPU machine for one short window, and judging
the KernelBench set there at its published sizes takes longer than the window has. Generation
is what needs the model; ``kernelrl eval --client fixed --fixed_solutions completions.jsonl``
judges the same completions later, anywhere (``learning_kb``). The requests are built as
``kernelrl.eval.sweep.Sweep`` builds them (tasks in load order, samples in order, batches of
``generation_batch``, seeds from ``sample_seed``), so a batch holds the prompts a sweep's batch
would, and each row records how its completion ended (``finish_reason``: a token-limit answer
is still one when judged).

    python benchmarks/learning_generate.py --config recipes/smollm2/learning/eval_heldout.yaml \\
        --model_name_or_path MODEL --benchmark folder --benchmark_path TASKS --samples 4 \\
        --output_dir OUT [--client transformers ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COMPLETIONS = "completions.jsonl"


def requests(config: Any, tasks: list[Any]) -> list[Any]:
    """One first-turn request per (task, sample), in a sweep's order, with its seeds."""
    from kernelrl.eval.clients import Request
    from kernelrl.eval.sweep import sample_seed
    from kernelrl.prompts import PromptBuilder

    prompts = PromptBuilder.from_file(
        config.prompt_template,
        backend=config.backend,
        one_shot=config.one_shot,
        system_prompt=config.system_prompt,
        history_turns=config.history_turns,
        feedback_template=config.feedback_template,
    )
    return [
        Request(
            task.id,
            sample,
            0,
            prompts.conversation(task, []),
            sample_seed(config.seed, task.id, sample, 0),
        )
        for task in tasks
        for sample in range(config.samples)
    ]


def generate(config: Any, client: Any, tasks: list[Any]) -> list[dict[str, Any]]:
    """The completions, as rows ``kernelrl eval --client fixed`` replays."""
    planned = requests(config, tasks)
    rows = []
    batch = max(1, config.generation_batch)
    for start in range(0, len(planned), batch):
        chunk = planned[start : start + batch]
        answers = client.generate(chunk)
        if len(answers) != len(chunk):
            raise RuntimeError(f"{len(answers)} completions for {len(chunk)} prompts")
        for request, answer in zip(chunk, answers, strict=True):
            rows.append(
                {
                    "task_id": request.task_id,
                    "sample": request.sample,
                    "turn": 0,
                    "completion": answer.text,
                    "finish_reason": answer.finish_reason,
                    "prompt_tokens": answer.prompt_tokens,
                    "completion_tokens": answer.completion_tokens,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    from kernelrl.launch.eval_cli import load_tasks, make_client, parse_sweep_recipe

    words = sys.argv[1:] if argv is None else argv
    config = parse_sweep_recipe(words)
    if config.client not in ("vllm", "transformers", "openai"):
        raise SystemExit(f"learning_generate: client {config.client!r} does not generate")
    if config.max_turns != 1:
        raise SystemExit("learning_generate: first turns only (max_turns: 1)")
    tasks = load_tasks(config)
    out = Path(config.output_dir) / COMPLETIONS
    if out.exists() and not config.overwrite:
        print(f"{out} exists; overwrite: true to generate again")
        return 0
    client = make_client(config, [t.id for t in tasks])
    try:
        rows = generate(config, client, tasks)
    finally:
        client.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
    partial.replace(out)
    print(f"{len(rows)} completions of {len(tasks)} tasks -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
