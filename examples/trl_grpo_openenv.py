"""Train TRL's GRPOTrainer against kernelrl's environment through OpenEnv, on CPU, without
kernelrl's trainer.

TRL's ``rollout_func`` hook plays each sample as one episode of the OpenEnv environment
(``kernelrl env openenv-serve``): ``reset(task_id=...)`` gives the task's prompt, the policy
writes a turn, ``step`` has it judged in the sandbox and answers with the feedback and the reward;
a later turn is written after the feedback (its tokens are masked out of the loss), until the
environment says ``done``. The sample's reward is the reward of its last turn (None, never 0,
when the environment could not judge it: TRL then leaves the sample out of the group's baseline).

    # a server in this process (a local pool of 1 CPU slot, two bundled tasks), one step
    python examples/trl_grpo_openenv.py
    # a running server (kernelrl env openenv-serve --config recipes/env/openenv_cpu.yaml); its
    # token is read as every client reads it: read_token("kernelrl-openenv")
    python examples/trl_grpo_openenv.py --url http://127.0.0.1:8200

The last line printed is a JSON summary (steps trained, each episode's statuses and reward).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL

from kernelrl.launch.openenv_env import KernelAction, KernelEnvClient  # noqa: E402

Messages = list[dict[str, str]]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="", help="a running OpenEnv server (default: start one)")
    parser.add_argument("--tasks", default="01_relu,06_row_sum", help="task ids to train on")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="kernelrl name or folder")
    parser.add_argument("--max-steps", type=int, default=1)
    parser.add_argument("--num-generations", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=2, help="of the in-process server")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per turn")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--output-dir", default="runs/examples/trl_grpo_openenv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0: torch's default, all cores)"
    )
    return parser.parse_args(argv)


def start_local_server(task_ids: list[str], max_turns: int) -> tuple[str, str, Any]:
    """An OpenEnv server in this process over a local pool of one CPU slot: its URL, its
    token, and what stops it."""
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool
    from kernelrl.launch.openenv_env import TaskList
    from kernelrl.launch.openenv_serve_cli import build_app, serve_in_thread
    from kernelrl.prompts import MultiTurnConfig

    pool = LocalPool(EvalConfig(device="cpu", timeout_s=120), workers=1)
    token = secrets.token_urlsafe(32)
    tasks = TaskList.bundled("triton", task_ids)
    app = build_app(pool, tasks, token, turns=MultiTurnConfig(max_turns=max_turns))
    server = serve_in_thread(app)

    def stop() -> None:
        server.stop()
        pool.close()

    return server.url, token, stop


def chat_ids(tokenizer: Any, messages: Messages, add_generation_prompt: bool) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
    )


def feedback_ids(tokenizer: Any, message: str, eos_ids: set[int]) -> list[int]:
    """The tokens that follow a finished assistant turn: the user message (the environment's
    revision message) and the next assistant turn's header. Found by rendering a conversation
    with and without it, so any chat template works."""
    dummy = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "answer"}]
    prefix = chat_ids(tokenizer, dummy, add_generation_prompt=False)
    full = chat_ids(tokenizer, [*dummy, {"role": "user", "content": message}], True)
    ends = [i for i, token in enumerate(prefix) if token in eos_ids]
    prefix = prefix[: ends[-1] + 1] if ends else prefix
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template does not extend a conversation as a prefix")
    return full[len(prefix) :]


class OpenEnvRollout:
    """TRL's ``rollout_func``: one OpenEnv episode (one WebSocket session) per prompt."""

    def __init__(
        self, url: str, token: str | None, tokenizer: Any, args: argparse.Namespace
    ) -> None:
        self.url, self.token, self.tokenizer, self.args = url, token, tokenizer, args
        self.eos_ids = {tokenizer.eos_token_id}
        self.task_of: dict[str, str] = {}  # prompt (JSON) -> task id, filled by ``dataset``
        self.episodes: list[dict[str, Any]] = []

    def dataset(self, task_ids: list[str]) -> Any:
        """One row per task: its prompt as the environment gives it."""
        from datasets import Dataset

        rows = []
        with KernelEnvClient(self.url, token=self.token).sync() as env:
            for task_id in task_ids:
                messages = env.reset(task_id=task_id).observation.messages
                self.task_of[json.dumps(messages, sort_keys=True)] = task_id
                rows.append({"prompt": messages})
        return Dataset.from_list(rows)

    def __call__(self, prompts: list[Messages], trainer: Any) -> dict[str, Any]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "env_mask")}
        out["env_reward"] = []
        for prompt in prompts:
            episode = self.play(model, self.task_of[json.dumps(prompt, sort_keys=True)])
            for key in out:
                out[key].append(episode[key])
        return {**out, "logprobs": None}

    def play(self, model: Any, task_id: str) -> dict[str, Any]:
        completion: list[int] = []
        mask: list[int] = []
        statuses = []
        with KernelEnvClient(self.url, token=self.token).sync() as env:
            observation = env.reset(task_id=task_id).observation
            prompt_ids = chat_ids(self.tokenizer, observation.messages, True)
            while True:
                ids = self.generate(model, prompt_ids + completion)
                completion += ids
                mask += [1] * len(ids)
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                result = env.step(KernelAction(completion=text))
                observation = result.observation
                statuses.append(observation.status)
                if result.done:
                    break
                suffix = feedback_ids(
                    self.tokenizer, observation.messages[-1]["content"], self.eos_ids
                )
                if not ids or ids[-1] not in self.eos_ids:  # close a turn cut at its token limit
                    suffix = [self.tokenizer.eos_token_id, *suffix]
                completion += suffix
                mask += [0] * len(suffix)
        self.episodes.append(
            {
                "task_id": task_id,
                "statuses": statuses,
                "reward": result.reward,
                "feedback_tokens": mask.count(0),  # what the environment said, not trained on
            }
        )
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion,
            "env_mask": mask,
            "env_reward": result.reward,
        }

    def generate(self, model: Any, context: list[int]) -> list[int]:
        import torch

        with torch.no_grad():
            output = model.generate(
                torch.tensor([context]),
                attention_mask=torch.ones(1, len(context), dtype=torch.long),
                max_new_tokens=self.args.max_new_tokens,
                do_sample=True,
                temperature=self.args.temperature,
                top_p=1.0,
                top_k=0,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        ids = output[0, len(context) :].tolist()
        ends = [i for i, token in enumerate(ids) if token in self.eos_ids]
        return ids[: ends[0] + 1] if ends else ids


def env_reward(completions: list, env_reward: list[float | None], **kwargs: Any) -> list:
    """The environment's reward of each episode, forwarded by ``rollout_func``."""
    return list(env_reward)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from kernelrl.launch.models import resolve_model

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    task_ids = [t for t in args.tasks.split(",") if t]
    stop = None
    url, token = args.url, None  # None: the client reads the server's token (read_token)
    if not url:
        url, token, stop = start_local_server(task_ids, args.max_turns)
    try:
        path = resolve_model(args.model)
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        rollout = OpenEnvRollout(url, token, tokenizer, args)
        config = GRPOConfig(
            output_dir=args.output_dir,
            use_cpu=True,
            bf16=False,
            seed=args.seed,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.num_generations,
            num_generations=args.num_generations,
            max_completion_length=args.max_new_tokens * args.max_turns,
            temperature=args.temperature,
            learning_rate=args.learning_rate,
            beta=0.0,
            gradient_checkpointing=False,  # TRL's default; without a KV cache, generation crawls
            logging_steps=1,
            save_strategy="no",
            report_to="none",
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=env_reward,
            args=config,
            train_dataset=rollout.dataset(task_ids),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
        trainer.train()
    finally:
        if stop is not None:
            stop()
    summary = {
        "steps": trainer.state.global_step,
        "episodes": rollout.episodes,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
