"""The trusted side of the sandbox protocol: the one place that speaks it.

A session drives one sandboxed child through one job:

    start(job[, admit]) -> "loaded" | "error" | "not_run"      (load the task; with admit, after
                                                                 the GPU memory it reports is
                                                                 reserved; then the solution,
                                                                 with the compile companion's
                                                                 channel if there is one:
                                                                 compile, build the model)
    send_call(seed); receive()  -> "outputs" | "error"           (one forward call on fresh inputs)
    read_tensors(described, on_chunk)                            (that call's output bytes)
    send_time(seed); receive()  -> "timing" | "error"            (timing and profile)

The job goes in two messages: the task (the child answers ``task_loaded`` once it has loaded it
and made its inputs once), then the solution. Until the solution is sent (``solution_sent``)
only our code has run in the child, so a failure it reports is ours; after, the child's word is
no evidence of anything, its failures included. Input seeds are sent one call at a time, so the
child never holds the seeds of calls it has not made yet. A call's outputs are described in its
message and their bytes follow in chunks through the output ring (``stream``), straight from
the harness after the call; the worker copies each chunk into its own memory before it reads
it, and holds one chunk of host memory at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from kernelrl.env.compare import DTYPES
from kernelrl.env.sandbox import compile_ahead
from kernelrl.env.sandbox.child_process import Child, ChildDied
from kernelrl.env.sandbox.companion import Companion
from kernelrl.env.sandbox.gpu_memory import GpuShare
from kernelrl.env.sandbox.protocol import CHUNK_BYTES, TASK_MODULE
from kernelrl.env.sandbox.stream import StreamError, read_tensor_bytes
from kernelrl.env.sandbox.triton_launchers import shared_launchers


def reference_as_solution() -> dict[str, Any]:
    """Job fields that make the child run the task's own ``Model`` as the solution: curation
    validates untrusted references this way, in the sandbox, with the evaluator's procedure."""
    return {
        "solution_source": f"from {TASK_MODULE} import Model as ModelNew\n",
        "expose_task": True,  # the task's module stays importable for the solution
    }


class SandboxSession:
    def __init__(
        self,
        child: Child,
        timeout_s: float,
        max_rss_bytes: int | None,
        gpu: GpuShare | None = None,
        companion: Companion | None = None,
    ) -> None:
        """``gpu``: the GPU memory admitted for this evaluation, which the child is held to
        while the session waits for it (``Child.receive``); ``companion``: the compile
        companion handed to the child with the solution, if it is fit to be."""
        self.child = child
        self.deadline = time.monotonic() + timeout_s
        self.max_rss_bytes = max_rss_bytes
        self.gpu = gpu
        self.companion = companion
        self.solution_sent = False
        self._buffer: torch.Tensor | None = None

    def receive(self) -> dict[str, Any]:
        message = self.child.receive(self.deadline, self.max_rss_bytes, self.gpu)
        if "launchers" in message:  # the child's word: only which launchers to build
            shared_launchers().learn(message["launchers"])
        return message

    def start(
        self,
        job: dict[str, Any],
        admit: Callable[[dict[str, Any]], dict[str, int]] | None = None,
    ) -> dict[str, Any]:
        """Send the job, the task first and then the solution, and return the child's answer
        to loading them; an answer before ``task_loaded`` is returned as it is, with the
        solution never sent.

        With ``admit``, the child first reports the task's footprint and waits: ``admit(footprint)``
        blocks until GPU memory is reserved and returns what was admitted: ``bytes``, and
        ``timing_placements``, the most input sets the run may time on (``timing.fitted``).
        """
        task_job = {key: value for key, value in job.items() if key != "solution_source"}
        self.child.send({"type": "job", **task_job, "await_admission": admit is not None})
        message = self.receive()
        if admit is not None and message["type"] == "footprint":
            self.child.send({"type": "admitted", **admit(message)})
            message = self.receive()
        if message["type"] != "task_loaded":
            return message  # the task failed to load or make its inputs: no solution code ran
        if self.gpu is not None:
            self.gpu.note_before_solution(self.child.pids())
        channel = self.companion.channel() if self.companion is not None else None
        self.solution_sent = True
        self.child.send(
            {
                "type": "solution",
                "solution_source": job["solution_source"],
                "compile_ahead": channel is not None,
            }
        )
        if channel is not None:
            try:  # the child waits for it before it loads the solution: a failure is ours
                compile_ahead.send_companion(self.child.sock, channel)
            except OSError as exc:
                self.child.kill("protocol")
                why = f"could not be handed its compile companion ({exc})"
                raise ChildDied(why, ours=True) from exc
        return self.receive()

    def memory_shortfall(self) -> str | None:
        """Why the device, not the solution, was short of this evaluation's GPU memory, when
        the worker can show it (``GpuShare.shortfall``); None otherwise and on a CPU."""
        return self.gpu.shortfall(self.child.pids()) if self.gpu is not None else None

    def send_call(self, seed: int) -> None:
        self.child.send({"type": "call", "seed": seed})

    def send_time(self, seed: int) -> None:
        self.child.send({"type": "time", "seed": seed})

    def send_time_next(self) -> None:
        """The reference's turn is over (interleaved timing): the child times its next set."""
        self.child.send({"type": "time_next"})

    def read_tensors(
        self,
        described: list[dict[str, Any]],
        on_chunk: Callable[[int, torch.Tensor], None],
        device: torch.device | None = None,
        guard: Callable[[], AbstractContextManager] = nullcontext,
    ) -> None:
        """Read the bytes of every tensor output in ``described`` (in order) and hand each chunk,
        as a 1-D tensor of the output's dtype, to ``on_chunk(output_index, chunk)``: in host
        memory, or with a CUDA ``device`` copied there straight from the ring (no host copy),
        under ``guard``, which ``on_chunk`` runs under too.

        The chunk's memory is reused for the next one: ``on_chunk`` must not keep it.
        """
        for index, entry in enumerate(described):
            if entry.get("kind") != "tensor":
                continue
            dtype = DTYPES.get(str(entry.get("dtype")))
            if dtype is None:
                raise ValueError(f"output {index}: unknown dtype {entry.get('dtype')!r}")
            chunks = read_tensor_bytes(
                self.child.output_ring,
                int(entry["nbytes"]),
                dtype.itemsize,
                self._chunk_buffer(device),
                self._receive_token,
                self._send_token,
                guard,
            )
            try:
                for chunk in chunks:
                    on_chunk(index, chunk.view(dtype))
            except StreamError as exc:
                self.child.kill("protocol")
                raise ChildDied(f"broke the output stream ({exc})") from None
            finally:
                chunks.close()  # the guard is let go now, not when the generator is collected

    def _receive_token(self, token: memoryview) -> None:
        self.child.receive_into(token, self.deadline, self.max_rss_bytes, self.gpu)

    def _send_token(self, token: bytes) -> None:
        self.child.send_token(token, self.deadline)

    def _chunk_buffer(self, device: torch.device | None) -> torch.Tensor:
        """Where chunks land: on a CUDA device, copied there from the device ring or from the
        host ring page-locked in this process too; otherwise host memory, page-locked where
        this process uses a GPU."""
        on_gpu = device is not None and device.type == "cuda"
        if on_gpu and not self.child.output_ring.on_device:
            self.child.ring.page_lock()
        wanted = device if on_gpu else torch.device("cpu")
        if self._buffer is None or self._buffer.device.type != wanted.type:
            pin = not on_gpu and torch.cuda.is_initialized()
            self._buffer = torch.empty(
                CHUNK_BYTES, dtype=torch.uint8, device=wanted, pin_memory=pin
            )
        return self._buffer
