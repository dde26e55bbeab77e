"""The trainer's glue on a tiny random model (transformers generation, ``use_vllm: false``):
turn-level advantages laid over the tokens against hand-computed values, metrics that describe
every trained turn, overlap (the batch trained on is the batch generated; staleness logged) and
an exact resume from a checkpoint. Seconds on CPU."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from rl_support import VerdictPool, task_rows, tiny_model, two_turn_config

from kernelrl.env.result import EvalResult, Status
from kernelrl.rl.config import KernelGRPOConfig, train_config
from kernelrl.rl.metrics import repeated_share, trained_reward_metrics
from kernelrl.rl.steps import over_tokens, turn_map
from kernelrl.rl.trainer import KernelGRPOTrainer, engine_kwargs

STATUSES = [Status.INCORRECT, Status.COMPILE_ERROR, Status.FORMAT_ERROR, Status.RUNTIME_ERROR]


def verdict(task, solution: str, call: int) -> Status:  # noqa: ANN001
    """A function of the text only, so that a resumed run gets the same verdicts."""
    return STATUSES[len(solution) % len(STATUSES)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(tmp_path_factory.mktemp("tiny"))


def config(output_dir: Path, **overrides: Any) -> KernelGRPOConfig:
    return two_turn_config(output_dir, **{**overrides})


class Recording(KernelGRPOTrainer):
    """Keeps what each step trained on (a view for the test, no behaviour change)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[dict[str, Any]] = []
        self.generated: list[tuple] = []

    def _start_rollout(self, inputs: list[dict[str, Any]], defer_last: bool) -> Any:
        batch = super()._start_rollout(inputs, defer_last)
        self.generated.append(batch.key)
        return batch

    def _apply_advantages(self, output: dict[str, Any], flight: Any, mode: str) -> None:
        super()._apply_advantages(output, flight, mode)
        self.steps.append(
            {
                "key": flight.rollout.key,
                "trajectories": flight.rollout.trajectories,
                "per_turn": flight.turns.components.clone(),
                "advantages": output["advantages"].clone(),
            }
        )


def rows() -> list[dict[str, Any]]:
    """Four prompts (two bundled tasks, twice), so that three steps stay in one epoch (the
    look-ahead of overlap_evaluation does not cross an epoch)."""
    first = task_rows(2)
    return first + [{**row, "id": f"{row['id']}_again"} for row in first]


def trainer(
    model_dir: str, args: KernelGRPOConfig, pool: VerdictPool, peft_config: Any = None
) -> Recording:
    from transformers import AutoTokenizer

    from kernelrl.data.schema import make_dataset

    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    return Recording(
        model=model_dir,
        args=args,
        train_dataset=make_dataset(rows(), "tasks"),
        processing_class=tok,
        pool=pool,
        peft_config=peft_config,
    )


def logs(trained: KernelGRPOTrainer) -> dict[int, dict]:
    return {e["step"]: e for e in trained.state.log_history if "reward" in e}


def test_turn_map_and_token_layout_by_hand() -> None:
    # sample 0: turn 0 (2 tokens), feedback (3), turn 1 (1); sample 1: turn 0 (3 tokens)
    tokens = turn_map([[0, 0, -1, -1, -1, 1], [0, 0, 0]], width=8)
    assert tokens.tolist() == [[0, 0, -1, -1, -1, 1, -1, -1], [0, 0, 0, -1, -1, -1, -1, -1]]
    advantages = torch.tensor([[0.5, -2.0], [1.5, 0.0]])
    assert over_tokens(advantages, tokens).tolist() == [
        [0.5, 0.5, 0, 0, 0, -2.0, 0, 0],
        [1.5, 1.5, 1.5, 0, 0, 0, 0, 0],
    ]
    mask = torch.tensor([[False, True], [True, False]])
    assert over_tokens(mask, tokens).tolist() == [
        [False, False, False, False, False, True, False, False],
        [True, True, True, False, False, False, False, False],
    ]
    with pytest.raises(ValueError, match="does not fit"):
        turn_map([[0] * 9], width=8)


def test_trained_reward_metrics_cover_every_turn() -> None:
    nan = float("nan")
    # one group of 3 samples, 2 turns, 2 components (weights 1 and 2)
    per_turn = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0]],  # rewards 1, 2
            [[1.0, 0.0], [nan, nan]],  # 1, not reached
            [[0.0, 0.0], [1.0, 1.0]],  # 0, 3 (turn 1 rejected below)
        ]
    )
    trained = torch.tensor([[True, True], [True, False], [True, False]])
    out = trained_reward_metrics(per_turn, torch.tensor([1.0, 2.0]), trained, 3, ["c0", "c1"])
    values = torch.tensor([1.0, 2.0, 1.0, 0.0])  # the four trained turns
    assert out["reward"] == pytest.approx(values.mean().item())
    assert out["reward_std"] == pytest.approx(values.std().item())
    # turn 0: rewards 1, 1, 0 (spread); turn 1: one trained sample -> no baseline signal
    assert out["frac_reward_zero_std"] == pytest.approx(1 / 4)
    assert out["rewards/c0/mean"] == pytest.approx((1 + 0 + 1 + 0) / 4)
    assert out["rewards/c1/mean"] == pytest.approx((0 + 1 + 0 + 0) / 4)


def test_repeated_share_counts_evaluations_of_a_pair_seen_before_in_the_batch() -> None:
    def judged(task: str, solution: str) -> EvalResult:
        return EvalResult(task, "triton", Status.CORRECT, task_hash=task, solution_hash=solution)

    # task a: one completion three times and another once; task b: the first one's text
    batch = [
        judged("a", "x"),
        judged("a", "x"),
        judged("a", "x"),
        judged("a", "y"),
        judged("b", "x"),
    ]
    assert repeated_share(batch) == pytest.approx(2 / 5)
    assert repeated_share([]) == 0.0


def test_step_trains_turn_level_trloo_laid_over_tokens(model_dir: str, tmp_path: Path) -> None:
    run = trainer(model_dir, config(tmp_path, max_steps=2), VerdictPool(verdict))
    run.train()
    assert len(run.steps) == 2
    weights = run.reward_weights
    for step, entry in zip(run.steps, logs(run).values(), strict=True):
        per_turn = step["per_turn"]  # [2 samples, 2 turns, K]
        rewards = (per_turn * weights).nansum(-1)
        valid = ~per_turn.isnan().all(-1)
        # TRLOO with a group of two: a turn's baseline is the other sample's reward at that turn
        expected = torch.zeros(2, 2)
        for t in range(2):
            if valid[:, t].all():
                expected[0, t] = rewards[0, t] - rewards[1, t]
                expected[1, t] = rewards[1, t] - rewards[0, t]
        for b, trajectory in enumerate(step["trajectories"]):
            row = step["advantages"][b]
            for position, turn in enumerate(trajectory.turn_index):
                want = 0.0 if turn < 0 else expected[b, turn].item()
                assert row[position].item() == pytest.approx(want), (b, position, turn)
            assert not row[len(trajectory.turn_index) :].any()  # padding
            # feedback tokens are never trained on: env_mask 0 exactly where turn_index is -1
            assert [m == 0 for m in trajectory.env_mask] == [t < 0 for t in trajectory.turn_index]
        # the logged reward is the mean over every trained turn, not the last turn's
        assert entry["reward"] == pytest.approx(rewards[valid].mean().item(), abs=1e-6)
        assert entry["turns/mean"] == 2


def test_overlap_trains_on_the_batch_it_generated(model_dir: str, tmp_path: Path) -> None:
    pool = VerdictPool(verdict)
    run = trainer(
        model_dir, config(tmp_path, max_steps=3, overlap_evaluation=True, env_device="cpu"), pool
    )
    run.train()
    # every batch was generated once (the look-ahead one is used, not regenerated) and each
    # step trained on the batch generated for its inputs
    assert len(run.generated) == 3
    assert [s["key"] for s in run.steps] == run.generated
    entries = logs(run)
    # step 1 generated with the initial weights; later batches one step before their update
    assert [entries[s]["rollout/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert [s["trajectories"][0].policy_step for s in run.steps] == [0, 0, 1]
    assert run._pending is None  # nothing generated that nobody trains on


def test_resume_continues_exactly(model_dir: str, tmp_path: Path) -> None:
    full = trainer(
        model_dir,
        config(tmp_path / "full", max_steps=3, save_strategy="steps", save_steps=1),
        VerdictPool(verdict),
    )
    full.train()
    assert (tmp_path / "full" / "checkpoint-1" / "kernelrl_state_0.pt").is_file()
    resumed = trainer(
        model_dir,
        config(tmp_path / "full", max_steps=3, save_strategy="no"),
        VerdictPool(verdict),
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    before, after = logs(full), logs(resumed)
    assert len(resumed.steps) == 2  # steps 2 and 3 were run again, step 1 was not
    for step in (2, 3):
        for key in ("reward", "num_tokens", "completions/mean_length", "turns/mean"):
            assert after[step][key] == pytest.approx(before[step][key]), (step, key)
        assert math.isfinite(after[step]["loss"])
    # the same completions, token for token
    assert [t.completion_ids for t in resumed.steps[-1]["trajectories"]] == [
        t.completion_ids for t in full.steps[-1]["trajectories"]
    ]
    assert resumed.steps[-1]["key"] == full.steps[-1]["key"]


def test_colocated_engine_samples_in_the_policys_dtype(tmp_path: Path) -> None:
    """vLLM's 'auto' runs a float32 model in bfloat16: the engine is given the policy's dtype,
    unless the recipe's ``vllm_engine_kwargs`` names one; server mode and no vLLM get none."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    def dtype_for(model: Any, **keys: Any) -> Any:
        args = train_config(use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate", **keys)
        return engine_kwargs(args, model).get("dtype")

    LlamaConfig(dtype="bfloat16").save_pretrained(tmp_path)
    assert dtype_for("any/path") == "float32"  # TRL loads a named model in float32
    assert dtype_for("any/path", model_init_kwargs={"dtype": "bfloat16"}) == "bfloat16"
    assert dtype_for(str(tmp_path), model_init_kwargs={"dtype": "auto"}) == "bfloat16"
    assert dtype_for(SimpleNamespace(dtype=torch.float16)) == "float16"
    assert dtype_for("m", vllm_engine_kwargs={"dtype": "bfloat16"}) == "bfloat16"
    server = train_config(use_cpu=True, bf16=False, use_vllm=True, vllm_mode="server")
    assert "dtype" not in engine_kwargs(server, "m")
    assert "dtype" not in engine_kwargs(train_config(use_cpu=True, bf16=False), "m")


def test_saved_rollouts_are_what_each_step_trained_on(model_dir: str, tmp_path: Path) -> None:
    """``save_rollouts``: one record per trained sample, its turns' texts, verdicts, rewards
    and advantages as trained, in the trajectory format curation reads."""
    from kernelrl.data.loaders import load_trajectories

    run = trainer(
        model_dir, config(tmp_path, max_steps=2, save_rollouts=True), VerdictPool(verdict)
    )
    run.train()
    path = tmp_path / "rollouts" / "rank0.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == sum(len(step["trajectories"]) for step in run.steps)
    weights = run.reward_weights
    trained = [(step, b) for step in run.steps for b in range(len(step["trajectories"]))]
    for record, (step, b) in zip(records, trained, strict=True):
        trajectory = step["trajectories"][b]
        assert record["task_id"] == trajectory.task.id
        rewards = (step["per_turn"][b] * weights).nansum(-1)
        for index, turn in enumerate(record["turns"]):
            assert turn["completion"] == trajectory.turns[index].text
            assert turn["result"]["status"] == str(trajectory.turns[index].result.status)
            assert turn["reward"] == pytest.approx(rewards[index].item(), abs=1e-6)
            # the advantage laid over this turn's tokens is the one recorded
            position = trajectory.turn_index.index(index)
            assert step["advantages"][b][position].item() == pytest.approx(turn["advantage"])
    assert len(load_trajectories([f"jsonl:{path}"])) == len(records)


def test_a_lora_policy_generates_from_a_merged_copy(model_dir: str, tmp_path: Path) -> None:
    """Transformers generation of a LoRA policy samples from a copy with the adapters merged:
    the same tokens as the adapted model under the same seed, with the trained model left as
    it was (adapters unmerged, weights unchanged)."""
    from peft import LoraConfig, PeftModel

    from kernelrl.rl import compat

    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    run = trainer(model_dir, config(tmp_path), VerdictPool(verdict), peft_config=lora)
    adapted = run.accelerator.unwrap_model(run.model_wrapped)
    assert isinstance(adapted, PeftModel)
    before = {name: value.clone() for name, value in adapted.state_dict().items()}
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]

    with compat.merged_lora_policy(run) as policy:
        assert not isinstance(policy, PeftModel)
        ids = torch.tensor(prompts)
        with torch.no_grad():
            merged_logits = policy(ids).logits
            adapted_logits = adapted(ids).logits
        torch.testing.assert_close(merged_logits, adapted_logits, rtol=1e-4, atol=1e-5)
        # the adapters matter here, so equal logits mean they were merged, not dropped
        with torch.no_grad(), adapted.disable_adapter():
            assert not torch.allclose(adapted(ids).logits, adapted_logits, atol=1e-3)

    sampled = compat.transformers_generate(run, prompts, 6, seed=3)
    with compat._override_attr(compat, "merged_lora_policy", _unmerged):
        reference = compat.transformers_generate(run, prompts, 6, seed=3)
    assert sampled == reference
    after = adapted.state_dict()
    assert before.keys() == after.keys()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)


def test_a_kept_generation_copy_follows_the_policy_in_place(model_dir: str, tmp_path: Path) -> None:
    """With compile_generation the merged copy outlives a step: after the adapters move, it
    samples what the adapted model samples, from the same weight tensors (the ones a compiled,
    CUDA-graphed decode step holds)."""
    run = lora_trainer(model_dir, tmp_path, compile_generation=True)
    kept = generate_twice_across_an_update(run)
    assert not hasattr(kept, "_compiled_call")  # on CPU transformers does not compile


@pytest.mark.gpu
def test_compiled_generation_follows_the_policy_on_a_gpu(model_dir: str, tmp_path: Path) -> None:
    run = lora_trainer(model_dir, tmp_path, compile_generation=True, use_cpu=False)
    kept = generate_twice_across_an_update(run)
    assert next(kept.parameters()).is_cuda
    assert hasattr(kept, "_compiled_call")  # the decode step ran compiled


def test_compile_generation_is_refused_with_vllm(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compile_generation"):
        config(tmp_path, compile_generation=True, use_vllm=True)


def lora_trainer(model_dir: str, tmp_path: Path, **overrides: Any) -> Recording:
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return trainer(model_dir, config(tmp_path, **overrides), VerdictPool(verdict), peft_config=lora)


def generate_twice_across_an_update(run: Recording) -> torch.nn.Module:
    """Generate, move the adapters as an optimizer step would, generate again; checks that the
    second generation used the same copy, refreshed in place, and sampled the adapted policy."""
    from kernelrl.rl import compat

    adapted = run.accelerator.unwrap_model(run.model_wrapped)
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    compat.transformers_generate(run, prompts, 6, seed=3)
    kept = run._kernelrl_generation_copy
    storage = {name: t.data_ptr() for name, t in kept.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in adapted.named_parameters():
            if "lora_B" in name:
                weight.add_(0.5 * torch.randn(weight.shape, generator=generator).to(weight))
    ids = torch.tensor(prompts, device=next(kept.parameters()).device)
    with torch.no_grad():  # until refreshed, the copy computes with its own, older weights
        assert not torch.allclose(kept(ids).logits, adapted(ids).logits, atol=1e-3)
    sampled = compat.transformers_generate(run, prompts, 6, seed=3)
    assert run._kernelrl_generation_copy is kept
    assert {name: t.data_ptr() for name, t in kept.state_dict().items()} == storage
    with torch.no_grad():
        torch.testing.assert_close(kept(ids).logits, adapted(ids).logits, rtol=1e-4, atol=1e-4)
    with compat._override_attr(compat, "merged_lora_policy", _unmerged):
        assert sampled == compat.transformers_generate(run, prompts, 6, seed=3)
    return kept


@contextlib.contextmanager
def _unmerged(trainer: KernelGRPOTrainer):  # noqa: ANN202
    yield trainer.model_wrapped
