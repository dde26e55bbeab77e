"""The trainer side of weight sync into a separate vLLM server on CPU (see
``kernelrl.rl.vllm_gloo`` for why gloo): TRL's ``VLLMClient`` with its two NCCL calls replaced.
"""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from trl.generation.vllm_client import VLLMClient

from kernelrl.rl.vllm_gloo import BACKEND, WORKER_EXTENSION, broadcast, gloo_group


class WeightSyncError(RuntimeError):
    """The server cannot take the trainer's weights (wrong weight-transfer backend)."""


def local_address_towards(host: str) -> str:
    """This machine's address as seen from ``host`` (the interface that routes to it): the
    address the server's workers dial to reach the trainer's store, on one box or across nodes."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))  # UDP: no packet is sent
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class GlooVLLMClient(VLLMClient):
    """TRL's ``VLLMClient`` with its two NCCL calls (join the group, broadcast the tensors)
    done over gloo; every HTTP request is TRL's."""

    timeout_s: float = 600.0

    def init_communicator(self, device: Any = None) -> None:
        config = self.get_server_info().get("weight_transfer_config")
        backend = (config or {}).get("backend")
        if backend != BACKEND:
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} has weight-transfer backend {backend!r}, "
                f"trainers on CPU need {BACKEND!r}: start it with `kernelrl serve` "
                f'(which adds --weight-transfer-config \'{{"backend": "{BACKEND}"}}\' '
                f"--worker-extension-cls {WORKER_EXTENSION} on CPU)"
            )
        world_size = self.get_world_size() + 1
        host = urlparse(self.base_url).hostname or "127.0.0.1"
        init_info = {
            "master_address": local_address_towards(host),
            "master_port": self.group_port,
            "rank_offset": 1,
            "world_size": world_size,
            "timeout_s": self.timeout_s,
        }
        # The server joins inside its request; the trainer joins here at the same time. If the
        # server refuses, the trainer would wait for it until the store's timeout: say why now.
        joined: dict[str, Any] = {}

        def join() -> None:
            try:
                joined["link"] = gloo_group(
                    init_info["master_address"], self.group_port, 0, world_size, self.timeout_s
                )
            except BaseException as exc:
                joined["error"] = exc

        joiner = threading.Thread(target=join, daemon=True)
        joiner.start()
        try:
            self._post(
                f"{self.base_url}/init_weight_transfer_engine", json={"init_info": init_info}
            )
        except Exception as exc:
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} could not join the weight-transfer group: "
                + " ".join(str(exc).split())[-400:]
            ) from exc
        joiner.join(self.timeout_s)
        if "link" not in joined:
            raise WeightSyncError(f"no gloo weight-transfer group: {joined.get('error')}")
        self.communicator = joined["link"]

    def update_named_params(self, metadata: list, named_params: Any) -> None:
        names, dtype_names, shapes = (list(field) for field in zip(*metadata, strict=True))
        update_info = {"names": names, "dtype_names": dtype_names, "shapes": shapes}
        if not self._updating_weights:
            self._start_weight_update()
        executor = ThreadPoolExecutor(max_workers=1)
        try:
            future = executor.submit(
                self._post, f"{self.base_url}/update_weights", json={"update_info": update_info}
            )
            for _name, tensor in named_params:
                broadcast(self.communicator, tensor.detach().to("cpu").contiguous())
            future.result()
        finally:
            executor.shutdown(wait=False)  # a dead server must not turn an error into a hang
        if not self._updating_weights:
            self._finish_weight_update()

    def close_communicator(self) -> None:
        self.communicator = None
