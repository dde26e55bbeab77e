"""The server side of weight sync into a separate vLLM server on CPU: a ``gloo`` backend.

Why: TRL 1.16's server mode (``vllm_mode: server``) pushes the trainer's weights into the
server through vLLM's weight-transfer engine with the ``nccl`` backend only
(``VLLMClient.init_communicator`` raises ``NotImplementedError`` for a device that is not
CUDA), and vLLM 0.32 ships no CPU backend (``nccl``, ``ipc`` = CUDA IPC, ``sparse_nccl``,
``sharded_rdt``, ``nccl_m2n``, ``modelexpress``). So the CPU topology adds one backend,
``gloo``, through vLLM's own extension point (``WeightTransferEngineFactory.register_engine``)
and TRL's own client (a subclass overriding the two NCCL calls: ``kernelrl.rl.server_sync``). Everything else is unchanged:
the same server (TRL's ``build_command``: dev-mode endpoints ``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``), the same request
order, the same layerwise reload on the server, TRL's ``sync_weights`` walking the parameters
(ZeRO-3 gathers, PEFT merges). gloo runs over TCP, so the same code serves a server on another
node; only the addresses change.

The server loads the backend through ``--worker-extension-cls
kernelrl.rl.vllm_gloo.GlooWorkerExtension``: vLLM imports that class in every worker before
the model is loaded (where the engine is built), and importing this module registers ``gloo``.

On CPU a tied LM head is not reloaded under its own name, so its oneDNN-packed copy would keep
the old weights (see ``kernelrl.rl.weight_sync``); ``finish_weight_update`` re-runs the
embedding layers' processing, as the colocated sync does.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

# Its own handler: the server runs vLLM's server module, not vLLM's CLI, and in that process no
# logging is configured, so an INFO line through vLLM's or the root logger would be dropped. The
# weight-update line is how a person (and the topology test) sees the server follow training.
logger = logging.getLogger("kernelrl.vllm_gloo")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False

BACKEND = "gloo"
WORKER_EXTENSION = "kernelrl.rl.vllm_gloo.GlooWorkerExtension"
GROUP_PREFIX = "kernelrl-weights"


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """Worker side of the rendezvous: the trainer's TCPStore and this worker's rank."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 600.0


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One update: the tensors, in the order the trainer broadcasts them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError("names, dtype_names and shapes must have the same length")


@dataclass
class GlooLink:
    """A gloo group outside torch.distributed's default group, and the store it met through
    (kept alive with it: rank 0's store is the rendezvous server)."""

    group: torch.distributed.ProcessGroupGloo
    store: torch.distributed.TCPStore


def gloo_group(address: str, port: int, rank: int, world_size: int, timeout_s: float) -> GlooLink:
    """Join the trainer <-> server group (the trainers' DDP group and vLLM's own group are left
    alone); rank 0 (the trainer) hosts the store."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = torch.distributed.TCPStore(
        address, port, world_size=world_size, is_master=rank == 0, timeout=timeout
    )
    prefixed = torch.distributed.PrefixStore(GROUP_PREFIX, store)
    return GlooLink(torch.distributed.ProcessGroupGloo(prefixed, rank, world_size, timeout), store)


def broadcast(link: GlooLink, tensor: torch.Tensor) -> None:
    """Rank 0's ``tensor`` into every member's (in place)."""
    options = torch.distributed.BroadcastOptions()
    options.rootRank = 0
    link.group.broadcast([tensor], options).wait()


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """vLLM worker side: receive checkpoint-format tensors over gloo, load them with vLLM's
    layerwise reload (as the NCCL engine does), then re-pack tied embeddings on CPU."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: GlooLink | None = None
        self.updates = 0
        self.received = 0

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.group = gloo_group(
            init_info.master_address,
            init_info.master_port,
            init_info.rank_offset + worker_rank,
            init_info.world_size,
            init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            UnquantizedEmbeddingMethod,
        )
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        for module in self.model.modules():  # tied heads: see the module docstring
            method = getattr(module, "quant_method", None)
            weight = getattr(module, "weight", None)
            tied = isinstance(method, UnquantizedEmbeddingMethod) and weight is not None
            if tied and weight.numel():
                method.process_weights_after_loading(module)
        self.updates += 1
        logger.info(  # tests count these lines: one per trainer step
            "kernelrl gloo weight update %d: %d tensors loaded", self.updates, self.received
        )
        self.received = 0

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(), which has no CPU device
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call init first")
        for name, dtype_name, shape in zip(
            update_info.names, update_info.dtype_names, update_info.shapes, strict=True
        ):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype_name))
            broadcast(self.group, tensor)
            self.model.load_weights([(name, tensor)])
            self.received += 1

    def shutdown(self) -> None:
        self.group = None


def register() -> None:
    """Make ``--weight-transfer-config '{"backend": "gloo"}'`` known to vLLM (idempotent)."""
    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)


class GlooWorkerExtension:  # this module imports nothing from TRL: it runs inside vLLM
    """Named with ``--worker-extension-cls``: vLLM imports it in each worker process before the
    model is loaded, which registers the backend there. Adds no method to the worker."""


register()
