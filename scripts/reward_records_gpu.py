"""Real EvalResults on a GPU -> reward components and rejection weights.

Regenerates ``tests/fixtures/rewards_h100_eval_results.jsonl``: eight bundled Triton solutions, a
matmul left to torch (an integrity violation), and a "lazy" ReLU that passes every check but
spends most of its GPU time in torch copy kernels. Prints every reward component and the
rejection stats; writes the records to ``$OUT/results.jsonl`` (or ``./results.jsonl``).

    python scripts/reward_records_gpu.py        # on a machine with a CUDA GPU
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kernelrl.data.bundled import bundled_pairs
from kernelrl.env.evaluator import EvalConfig
from kernelrl.env.pools.local import LocalPool
from kernelrl.rewards import RewardConfig, reward_components, total_reward
from kernelrl.rl.rejection import RejectionConfig, rejection_weights

TASKS = [
    "01_relu",
    "06_row_sum",
    "10_layernorm",
    "14_softmax_rows",
    "18_matmul",
    "21_linear",
    "29_residual_add_layernorm",
    "30_scaled_qk_softmax",
]


def main() -> None:
    pairs = {task.id: (task, source) for task, source in bundled_pairs()}
    tasks = [pairs[name][0] for name in TASKS]
    sources = [pairs[name][1] for name in TASKS]
    relu_task, relu = pairs["01_relu"]
    # Cheat: the ReLU kernel is defined and launched, the matmul is left to torch.
    cheat = relu.replace("class ModelNew", "class _Relu") + (
        "\n\nclass ModelNew(torch.nn.Module):\n"
        "    def forward(self, a, b):\n"
        "        return _Relu().forward(torch.matmul(a, b))\n"
    )
    # Lazy: correct and honest to every check, but three layout round trips (copy kernels).
    lazy = relu.replace(
        "        return relu(x)",
        "        for _ in range(3):\n"
        "            x = x.t().contiguous().t().contiguous()\n"
        "        return relu(x)",
    )
    assert lazy != relu, "the bundled ReLU solution changed; update the lazy variant"
    tasks += [pairs["18_matmul"][0], relu_task]
    sources += [cheat, lazy]
    completions = [f"```python\n{source}\n```" for source in sources]

    started = time.time()
    with LocalPool(EvalConfig(device="cuda", timeout_s=240), workers=1) as pool:
        results = pool.evaluate(tasks, completions)
    print(f"evaluated {len(results)} in {time.time() - started:.1f}s on {results[0].device_name}")
    for baseline in ("eager", "compile"):
        config = RewardConfig(speedup_baseline=baseline)
        print(f"--- speedup baseline {baseline}")
        for task, result in zip(tasks, results, strict=True):
            parts = {k: round(v, 3) for k, v in reward_components(result, config).items()}
            print(
                f"{task.id:26s} {result.status:20s} share={result.own_kernel_share} "
                f"fails={result.checks_failed} {parts} total={total_reward(result, config):.3f}"
            )
    for config in (RejectionConfig(), RejectionConfig(mode="downweight", weight=0.2)):
        weights, stats = rejection_weights(results, config)
        print(f"rejection {config.mode}: {weights.tolist()} {stats}")
    out = Path(os.environ.get("OUT", ".")) / "results.jsonl"
    out.write_text("".join(result.to_json() + "\n" for result in results))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
