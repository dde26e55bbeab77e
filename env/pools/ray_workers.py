"""The Ray side of ``RayPool``: the actors that evaluate, their life, and the cluster.

- ``EvalWorker``, one per GPU: an async actor owning an ``Evaluator`` for its GPU. Evaluations
  run on its threads (``slots`` at once; the Evaluator serialises the GPU-exclusive timing), so
  its event loop stays free and ``info`` answers even while every slot is busy.
- ``PrecheckWorker``, CPU only: the stages that run nothing (parse, static integrity checks),
  exactly as the Evaluator runs them (``evaluator.check_statically``), so a completion that
  fails them is answered without taking a GPU slot.
- ``Fleet``: the GPU actors' life. Ray restarts a dead actor (``max_restarts``) and holds the
  calls made to it meanwhile; the fleet counts each death once, waits for the restart with one
  such call, and replaces an actor that stays dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kernelrl.env.evaluator import EvalConfig, check_statically, finish_result, new_result
from kernelrl.env.pools.base import own_config
from kernelrl.env.pools.sizing import AUTO, HostResources, size_gpu_pool
from kernelrl.env.pools.verdicts import first_line
from kernelrl.env.result import EvalResult
from kernelrl.env.task import Task, TaskError

log = logging.getLogger("kernelrl.env.pools.ray")


def node_resources(gpu_index: int) -> HostResources:
    """This node's cores and memory, shared by the GPUs it shows (every actor of the node sees
    them all: ``CUDA_VISIBLE_DEVICES`` is not narrowed), and the actor's GPU's memory; a node
    without a GPU (logical GPUs) counts as one."""
    import torch

    if not torch.cuda.is_available():
        return HostResources.detect()
    memory = torch.cuda.get_device_properties(gpu_index).total_memory
    return HostResources.detect(torch.cuda.device_count(), memory)


class EvalWorker:
    """Ray actor body: one Evaluator on the GPU Ray assigned to this actor.

    Ray is told not to narrow ``CUDA_VISIBLE_DEVICES`` for this actor: the Evaluator's sandbox
    children pick their GPU by index, so the actor passes the index of its assigned GPU among
    the node's visible GPUs (with a narrowed variable every actor's children would use GPU 0).
    """

    def __init__(self, config: EvalConfig, slots: int, store_path: str | None = None) -> None:
        """``slots``: evaluations at once, or ``AUTO`` to size them (and the spares) from this
        actor's own host, which the driver's may not be."""
        import ray

        from kernelrl.env.evaluator import Evaluator

        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        gpu_index = 0
        if self.gpu_ids:
            visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
            first = self.gpu_ids[0]
            gpu_index = visible.index(first) if first in visible else int(first)
        if slots == AUTO:
            sizing = size_gpu_pool(node_resources(gpu_index))
            slots, config = sizing.per_gpu, own_config(config, sizing.spares)
        self.slots = slots
        timing_cache = None
        if store_path:
            from kernelrl.env.store import ResultsStore

            timing_cache = ResultsStore(store_path).reference_timings()
        self.evaluator = Evaluator(config, gpu_index=gpu_index, timing_cache=timing_cache)
        self.evaluator.warm()
        self.threads = ThreadPoolExecutor(slots, thread_name_prefix="kernelrl-eval")
        self.node = ray.get_runtime_context().get_node_id()
        self.started = time.time()

    async def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "node": self.node,
            "gpu_ids": self.gpu_ids,
            "device": self.evaluator.device_kind,
            "device_name": self.evaluator.device_name,
            "versions": self.evaluator.versions,
            "started": self.started,
            "slots": self.slots,
        }

    async def evaluate(self, task: Task, solution: str) -> tuple[str, Any]:
        """("ok", EvalResult) | ("task_error", message) | ("error", message): exceptions are
        returned, not raised, so that only a dead actor shows up as a Ray error."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.threads, self._evaluate, task, solution)

    def _evaluate(self, task: Task, solution: str) -> tuple[str, Any]:
        try:
            return "ok", self.evaluator.evaluate(task, solution)
        except TaskError as exc:
            return "task_error", str(exc)
        except Exception as exc:
            return "error", f"{type(exc).__name__}: {exc}"

    async def close(self) -> None:
        """Stop warm children, and kill the ones still running a solution with all they
        spawned (a compiler, say): each leads its own process group, which the kernel's death
        signal at the actor's exit would not reach beyond the child itself."""
        await asyncio.get_running_loop().run_in_executor(None, self.evaluator.close)
        kill_child_process_groups()


class PrecheckWorker:
    """Ray actor body: parse and static integrity checks, pure AST, no GPU, no execution."""

    def __init__(self, static_checks: bool, where: tuple[str, str, dict[str, str]]) -> None:
        """``where``: (device, device_name, versions) of the GPU workers, for the verdicts."""
        self.static_checks = static_checks
        self.where = where

    def check(self, task: Task, completion: str) -> EvalResult | None:
        return precheck(task, completion, self.static_checks, self.where)


def precheck(
    task: Task, completion: str, static_checks: bool, where: tuple[str, str, dict[str, str]]
) -> EvalResult | None:
    """None when the completion passes parse and static checks; else the Evaluator's own
    verdict at those stages (``format_error`` / ``integrity_violation``)."""
    started = time.perf_counter()
    result = new_result(task, completion, *where)
    if check_statically(task, completion, result, static_checks) is not None:
        return None
    result.phase_seconds["precheck"] = time.perf_counter() - started
    return finish_result(result, time.perf_counter() - started)


@dataclass(eq=False)
class Worker:
    """One GPU actor as the pool sees it."""

    index: int
    handle: Any
    info: dict[str, Any] = field(default_factory=dict)
    state: str = "ok"  # ok | restarting | dead
    incarnation: int = 0  # bumped at each counted death: older calls' failures are that death
    completed: int = 0
    deaths: int = 0
    calls: set[Any] = field(default_factory=set)  # the pool's calls in flight on it
    killed_pid: int | None = None  # the process the pool killed: back means a new one answers


@dataclass(eq=False)
class Checker:
    """One pre-check actor as the pool sees it."""

    index: int
    handle: Any
    state: str = "ok"  # ok | restarting (its last check failed: Ray restarts it)
    in_flight: int = 0
    completed: int = 0
    deaths: int = 0


class Fleet:
    def __init__(
        self,
        count: int,
        actor_args: tuple[Any, ...],
        *,
        max_restarts: int,
        max_replacements: int,
        cpus_per_worker: float,
        runtime_env: dict[str, Any] | None,
    ) -> None:
        """``count`` EvalWorker actors, one GPU each, built from ``actor_args``."""
        import ray

        env = dict(runtime_env or {})
        env["env_vars"] = {
            **env.get("env_vars", {}),
            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
            # Ray kills a dying actor's children before the actor stops answering: an
            # evaluation whose child it killed would be answered as the solution's crash. The
            # children die with the actor instead (PR_SET_PDEATHSIG, see sandbox_child).
            "RAY_kill_child_processes_on_worker_exit": "0",
        }
        # max_task_retries=0: Ray would rerun a call whose actor died beside the others on the
        # restarted actor; blame isolation needs it rerun alone, which only the pool arranges.
        self._actor = ray.remote(EvalWorker).options(
            num_gpus=1, num_cpus=cpus_per_worker, max_restarts=max_restarts,
            max_task_retries=0, runtime_env=env,
        )  # fmt: skip
        self._actor_args = actor_args
        self._replacements_left = max_replacements
        self.workers = [Worker(i, self._actor.remote(*actor_args)) for i in range(count)]
        self.checkers: list[Checker] = []
        self._idle: asyncio.Queue[Checker] = asyncio.Queue()

    def start(
        self, precheck_workers: int, static_checks: bool, max_restarts: int,
        runtime_env: dict[str, Any] | None, timeout_s: float,
    ) -> dict[str, Any]:  # fmt: skip
        """Wait for the GPU actors, then start the pre-check actors (as the GPU workers
        check); if any fails, every actor is killed. The first worker's ``info``."""
        try:
            first = self.ready(timeout_s)
            where = (first["device"], first["device_name"], first["versions"])
            self.start_checkers(precheck_workers, static_checks, where, max_restarts,
                                runtime_env, timeout_s)  # fmt: skip
        except Exception:
            self.kill()
            raise
        return first

    def ready(self, timeout_s: float) -> dict[str, Any]:
        """Wait for every actor's constructor; the first worker's ``info``."""
        infos = wait_ready([w.handle.info.remote() for w in self.workers], timeout_s)
        for worker, info in zip(self.workers, infos, strict=True):
            worker.info = info
        return self.workers[0].info

    def start_checkers(
        self, count: int, static_checks: bool, where: tuple[str, str, dict[str, str]],
        max_restarts: int, runtime_env: dict[str, Any] | None, timeout_s: float,
    ) -> None:  # fmt: skip
        """Pre-check actors; Ray retries a check whose actor died (``max_task_retries``)."""
        import ray

        actor = ray.remote(PrecheckWorker).options(
            num_cpus=1, num_gpus=0, max_restarts=max_restarts, max_task_retries=2,
            runtime_env=runtime_env,
        )  # fmt: skip
        handles = [actor.remote(static_checks, where) for _ in range(count)]
        self.checkers = [Checker(len(self.workers) + i, h) for i, h in enumerate(handles)]
        wait_ready([h.__ray_ready__.remote() for h in handles], timeout_s)
        for checker in self.checkers:
            self._idle.put_nowait(checker)

    async def check(
        self, task: Task, completion: str, wanted: Callable[[], bool]
    ) -> EvalResult | None:
        """Pre-check on the next idle pre-check actor (ActorPool-style). None when it passes,
        and when it could not run (the GPU worker checks anyway); ``wanted()`` False: skip."""
        import ray

        checker = await self._idle.get()
        checker.in_flight = 1
        try:
            if not wanted():
                return None
            verdict = await checker.handle.check.remote(task, completion)
            checker.completed, checker.state = checker.completed + 1, "ok"
            return verdict
        except ray.exceptions.RayError as exc:
            checker.deaths, checker.state = checker.deaths + 1, "restarting"
            log.warning("pre-check failed, the GPU worker checks: %s", first_line(str(exc)))
            return None
        finally:
            checker.in_flight = 0
            self._idle.put_nowait(checker)

    @property
    def all_dead(self) -> bool:
        return all(w.state == "dead" for w in self.workers)

    def died(self, worker: Worker, cause: str) -> bool:
        """Count a death of ``worker`` (the caller has checked it is a new one). True when the
        caller should wait for it to come back (``revive``): it was serving until now."""
        worker.incarnation += 1
        worker.deaths += 1
        log.warning("kernelrl ray worker %d failed: %s", worker.index, first_line(cause))
        if worker.state != "ok":
            return False
        worker.state = "restarting"
        return True

    async def revive(self, worker: Worker, closing: Callable[[], bool]) -> bool:
        """Wait until Ray has restarted ``worker`` (a call to a restarting actor is held until
        it is back); replace it when it stays dead. False: gone, nothing left to replace it."""
        import ray

        refused = 0
        while True:
            try:
                info = await worker.handle.info.remote()
                if worker.killed_pid is not None and info["pid"] == worker.killed_pid:
                    await asyncio.sleep(0.5)  # the kill has not landed yet: not back
                    continue
                worker.info, worker.killed_pid = info, None
                break
            except ray.exceptions.ActorDiedError:
                refused += 1  # once or twice: the call may have reached the dying incarnation
                if refused < 3:
                    await asyncio.sleep(1.0)
                    continue
                if self._replacements_left <= 0 or closing():
                    worker.state = "dead"
                    if not closing():
                        log.error(
                            "kernelrl ray worker %d is gone, no replacement left", worker.index
                        )
                    return False
                self._replace(worker)
                refused = 0
            except ray.exceptions.RayError:
                await asyncio.sleep(0.5)
        worker.state = "ok"
        log.info("kernelrl ray worker %d is back (pid %s)", worker.index, worker.info.get("pid"))
        return True

    def _replace(self, worker: Worker) -> None:
        import ray

        self._replacements_left -= 1
        log.warning("kernelrl ray worker %d is gone for good: starting a replacement", worker.index)
        with contextlib.suppress(Exception):
            ray.kill(worker.handle, no_restart=True)
        worker.handle = self._actor.remote(*self._actor_args)
        worker.incarnation += 1

    def restart(self, worker: Worker) -> None:
        """Kill a stuck worker; Ray restarts it."""
        import ray

        worker.killed_pid = worker.info.get("pid")
        ray.kill(worker.handle, no_restart=False)

    def close(self, timeout_s: float = 30.0) -> None:
        """Let each live worker stop its sandbox children, then kill every actor."""
        import ray

        live = [w.handle.close.remote() for w in self.workers if w.state != "dead"]
        ray.wait(live, num_returns=len(live), timeout=timeout_s)  # a dead one simply errs
        self.kill()

    def kill(self) -> None:
        import ray

        for handle in [w.handle for w in self.workers] + [c.handle for c in self.checkers]:
            with contextlib.suppress(Exception):
                ray.kill(handle, no_restart=True)

    def rows(self, in_flight: Callable[[int], int]) -> list[dict[str, Any]]:
        """One row per worker for ``stats()``; ``in_flight(index)`` counts its evaluations."""
        return [
            {
                "index": w.index,
                "kind": "gpu",
                "state": w.state,
                "in_flight": in_flight(w.index),
                "completed": w.completed,
                "deaths": w.deaths,
                "gpu_ids": w.info.get("gpu_ids", []),
                "node": w.info.get("node", ""),
                "pid": w.info.get("pid"),
            }
            for w in self.workers
        ] + [
            {
                "index": c.index,
                "kind": "cpu",
                "state": c.state,
                "in_flight": c.in_flight,
                "completed": c.completed,
                "deaths": c.deaths,
                "gpu_ids": [],
                "node": "",
                "pid": None,
            }
            for c in self.checkers
        ]


def wait_ready(refs: list[Any], timeout_s: float) -> list[Any]:
    """The values of the actors' first calls, once every actor is up (constructed)."""
    import ray

    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        raise RuntimeError(
            f"{len(pending)} of {len(refs)} Ray workers were not ready after {timeout_s:.0f} s"
            f" (cluster resources: {ray.available_resources()})"
        )
    return ray.get(refs)


def kill_child_process_groups() -> None:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # ppid; a sandbox child leads its own group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry), signal.SIGKILL)


def init_ray(
    address: str | None,
    namespace: str | None,
    logical_gpus: int | None,
    workers: int | None,
    cpu_workers: int,
) -> bool:
    """Join ``address``, reuse an initialised Ray, or start a local one (with ``logical_gpus``,
    default ``workers`` or 1, on a machine without GPUs). True if this call connected or
    started Ray (the caller then shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"namespace": namespace, "log_to_driver": False}
    if address and address != "local":
        ray.init(address=address, **kwargs)
        return True  # disconnects on close; the cluster itself lives on
    # "local", not None: ray.init() without an address joins a cluster it finds on this machine
    # (RAY_ADDRESS, or the last `ray start`); a pool without an address must start its own.
    import torch

    if logical_gpus is None and not torch.cuda.is_available():
        logical_gpus = workers or 1
    if logical_gpus is not None:
        kwargs["num_gpus"] = logical_gpus
    # Logical CPUs: every actor fits even on a 2-core machine (the OS shares the cores).
    kwargs["num_cpus"] = max(os.cpu_count() or 1, (workers or logical_gpus or 1) + cpu_workers)
    ray.init(address="local", include_dashboard=False, **kwargs)
    return True
