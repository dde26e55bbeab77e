"""``kernelrl env serve | status | stop``: the shared environment service on Ray.

    kernelrl env serve --config recipes/env/local_cpu.yaml [--key value ...]
    kernelrl env status [--address ADDR] [--name NAME] [--namespace NS] [--json]
    kernelrl env stop [--address ADDR] [--name NAME] [--namespace NS]

``serve`` joins a Ray cluster (``address``) or starts a local one (with logical GPUs on a
machine without any), starts the named, detached service actor and its GPU workers, optionally
the HTTP endpoint (Ray Serve), prints how to reach them, and keeps running until Ctrl-C or
SIGTERM, then shuts everything down. With ``detach: true`` (only with an ``address``: a local
Ray instance ends with this process) it returns at once and leaves the service running until
``kernelrl env stop``. Its recipe is parsed the TRL way (YAML defaults, ``--key value`` flags on
top), like every kernelrl recipe, so the ``serve`` subparser takes its words verbatim.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kernelrl.env.backends import get_backend
from kernelrl.env.pools import EVALS_PER_GPU
from kernelrl.launch.recipe import add_recipe_command, parse_recipe

SERVE_USAGE = """usage: kernelrl env serve --config recipes/env/RECIPE.yaml [--key value ...]

Every recipe key can be given as a flag (--workers 4 --http_port 8001);
`kernelrl env serve --config X --help` lists them."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class EnvServiceConfig:
    """One environment service: where it runs, its workers, its store, its HTTP endpoint."""

    name: str = field(default="kernelrl-env", metadata=_help("name clients find the service by"))
    namespace: str = field(default="kernelrl", metadata=_help("Ray namespace of the service"))
    address: str | None = field(
        default=None,
        metadata=_help("Ray cluster to join ('auto' or host:port); unset: start a local one"),
    )
    workers: int | None = field(
        default=None, metadata=_help("GPU worker actors (default: every GPU of the cluster)")
    )
    logical_gpus: int | None = field(
        default=None,
        metadata=_help("GPUs to declare when starting a local Ray without GPUs (default: workers)"),
    )
    per_gpu: int = field(
        default=EVALS_PER_GPU, metadata=_help("evaluations in flight per GPU worker")
    )
    precheck_workers: int = field(
        default=1, metadata=_help("CPU actors for parsing and static checks (0: none)")
    )
    device: str = field(default="auto", metadata=_help("cpu, cuda or auto"))
    backend: str = field(default="triton", metadata=_help("backend of the named tasks"))
    timeout_s: float = field(default=180.0, metadata=_help("limit for one evaluation"))
    batch_timeout_s: float | None = field(
        default=None, metadata=_help("default deadline of a submitted batch")
    )
    max_pending: int = field(default=1024, metadata=_help("queued + running evaluations at most"))
    max_retries: int = field(
        default=2, metadata=_help("retries of an evaluation whose worker died")
    )
    store_path: str = field(
        default="",
        metadata=_help("results store file ('' = $KERNELRL_CACHE/results.db, 'none' = no store)"),
    )
    tasks: str = field(
        default="bundled",
        metadata=_help("tasks HTTP clients may name by id: 'bundled' or a task folder"),
    )
    http: bool = field(default=True, metadata=_help("serve POST /evaluate with Ray Serve"))
    http_host: str = field(default="127.0.0.1", metadata=_help("HTTP bind address"))
    http_port: int = field(default=8100, metadata=_help("HTTP port (8000 is left to vLLM servers)"))
    http_max_body_mb: float = field(
        default=8.0, metadata=_help("larger HTTP request bodies are refused (413)")
    )
    http_body_timeout_s: float = field(
        default=30.0,
        metadata=_help("a request body not received by then is refused (408): slow clients"),
    )
    detach: bool = field(
        default=False, metadata=_help("return once started (needs address: a cluster that stays)")
    )
    ready_timeout_s: float = field(default=600.0, metadata=_help("wait this long for workers"))

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be cpu, cuda or auto, got {self.device!r}")
        get_backend(self.backend)
        if self.detach and not self.address:
            raise ValueError(
                "detach needs an address: a local Ray instance ends with `kernelrl env serve`"
            )
        for name in ("per_gpu", "max_pending", "http_port"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("http_max_body_mb", "http_body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    def resolved_store_path(self) -> str | None:
        if self.store_path.lower() == "none":
            return None
        if self.store_path:
            return str(Path(self.store_path).expanduser().resolve())
        cache = Path(os.environ.get("KERNELRL_CACHE", Path.home() / ".cache" / "kernelrl"))
        return str(cache / "results.db")


# ---------------------------------------------------------------------------------- parser
def add_subcommand(env_commands: Any) -> None:
    """Adds ``serve``, ``status`` and ``stop`` to the ``kernelrl env`` subcommands."""
    add_recipe_command(
        env_commands,
        "serve",
        help="start the shared environment service (Ray actors + HTTP)",
        run=_serve,
        recipe_types=lambda: (EnvServiceConfig,),
        usage=SERVE_USAGE,
    )

    for command, text, handler in (
        ("status", "workers, queue depth, throughput and failures of a service", _status),
        ("stop", "stop a running service", _stop),
    ):
        parser = env_commands.add_parser(command, help=text)
        parser.add_argument(
            "--address", default="auto", help="Ray cluster of the service (default: auto)"
        )
        parser.add_argument("--name", default="kernelrl-env")
        parser.add_argument("--namespace", default="kernelrl")
        if command == "status":
            parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.set_defaults(handler=handler)


def parse_service_recipe(words: list[str]) -> EnvServiceConfig:
    """EnvServiceConfig from ``--config FILE`` plus flag overrides (``RecipeError`` if unusable)."""
    (config,) = parse_recipe(words, (EnvServiceConfig,), "kernelrl env serve")
    return config


# ---------------------------------------------------------------------------------- serve
def _load_tasks(config: EnvServiceConfig) -> dict[str, Any]:
    from kernelrl.env.task import load_task_folder

    if config.tasks == "bundled":
        from kernelrl.data.bundled import bundled_tasks

        tasks = bundled_tasks(config.backend)
    else:
        tasks = load_task_folder(config.tasks, config.backend)
    return {task.id: task for task in tasks}


def _serve(words: list[str]) -> int:
    config = parse_service_recipe(words)
    tasks = _load_tasks(config)
    store_path = config.resolved_store_path()

    import ray

    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.ray_workers import init_ray
    from kernelrl.env.service import start_http, start_service, stop_service

    console = Console(stderr=True)
    if not config.address:  # a local Ray of our own: nothing of it may outlive us, even a SIGKILL
        from kernelrl.launch.reaper import start_reaper

        start_reaper()
    started_ray = init_ray(
        config.address,
        config.namespace,
        config.logical_gpus,
        config.workers,
        config.precheck_workers,
    )
    eval_config = EvalConfig(device=config.device, timeout_s=config.timeout_s)
    pool_kwargs = {
        "workers": config.workers,
        "per_gpu": config.per_gpu,
        "max_pending": config.max_pending,
        "precheck_workers": config.precheck_workers,
        "max_retries": config.max_retries,
        "batch_timeout_s": config.batch_timeout_s,
    }
    try:
        with console.status(f"starting environment service {config.name!r}..."):
            actor = start_service(
                eval_config,
                pool_kwargs,
                store_path,
                tasks,
                name=config.name,
                namespace=config.namespace,
                ready_timeout_s=config.ready_timeout_s,
            )
            info = ray.get(actor.info.remote())
            url = (
                start_http(
                    config.name,
                    config.namespace,
                    config.http_host,
                    config.http_port,
                    max_body_bytes=int(config.http_max_body_mb * (1 << 20)),
                    body_timeout_s=config.http_body_timeout_s,
                )
                if config.http
                else None
            )
    except BaseException:
        _teardown(config, started_ray, stop_service)
        raise
    address = ray.get_runtime_context().gcs_address
    # Ray enables token authentication on local clusters; a client joining by explicit address
    # must opt in (Ray never sends its token to an address it was merely given).
    auth = "RAY_AUTH_MODE=token " if os.environ.get("RAY_AUTH_MODE") == "token" else ""
    lines = [
        f"kernelrl env service {config.name!r} ready: {info['workers']} workers,"
        f" {info['num_slots']} slots on {info['device_name']}; {len(tasks)} named tasks;"
        f" store {store_path or 'off'}",
        f"  Ray clients: ServiceClient(name={config.name!r}, address={address!r},"
        f" namespace={config.namespace!r})",
        f"  status:      {auth}kernelrl env status --address {address} --name {config.name}",
    ]
    if url:
        lines.append(f"  HTTP:        POST {url}/evaluate   GET {url}/status")
    print("\n".join(lines), flush=True)
    if config.detach:
        return 0

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    code = 0
    try:
        while not stop.wait(5.0):
            if not _alive(actor):
                console.print(f"[red]the service actor {config.name!r} is gone[/red]")
                code = 1
                break
    finally:
        print(f"stopping environment service {config.name!r}", flush=True)
        _teardown(config, started_ray, stop_service)
    return code


def _alive(actor: Any) -> bool:
    import ray
    from ray.exceptions import ActorDiedError, GetTimeoutError, RayError

    try:
        ray.get(actor.info.remote(), timeout=60)
    except ActorDiedError:
        return False
    except (GetTimeoutError, RayError):  # busy or restarting: not gone
        return True
    return True


def _teardown(config: EnvServiceConfig, started_ray: bool, stop_service: Any) -> None:
    import ray

    stop_service(config.name, config.namespace)
    if config.http:
        from ray import serve

        try:
            serve.shutdown()
        except Exception as exc:  # Serve never started
            print(f"(serve shutdown: {exc})", file=sys.stderr)
    if started_ray and ray.is_initialized():
        ray.shutdown()


# ---------------------------------------------------------------------------------- status
def use_local_ray_token() -> bool:
    """Send this machine's Ray token when the user set no auth mode: local clusters (the ones
    ``env serve`` starts) require it, and Ray only sends it when RAY_AUTH_MODE=token, so
    ``env status`` / ``env stop`` would otherwise need that prefix. True if it was turned on."""
    if os.environ.get("RAY_AUTH_MODE"):
        return False
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    if not (os.environ.get("RAY_AUTH_TOKEN") or token_file.is_file()):
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    return True


def _status(args: argparse.Namespace) -> int:
    from kernelrl.env.pools.service import ServiceClient

    use_local_ray_token()

    with ServiceClient(args.name, args.address, args.namespace) as client:
        stats = client.stats()
        stats["address"] = client.address
    if args.json:
        print(json.dumps(stats, sort_keys=True, default=str))
        return 0
    console = Console()
    table = Table(title=f"kernelrl env service {args.name!r} at {stats['address']}")
    for column in ("worker", "kind", "state", "in flight", "done", "deaths", "gpu", "pid"):
        table.add_column(column, justify="right" if column in ("in flight", "done") else "left")
    for w in stats["workers"]:
        state_style = {"ok": "green", "restarting": "yellow"}.get(w["state"], "red")
        table.add_row(
            str(w["index"]),
            w["kind"],
            f"[{state_style}]{w['state']}[/{state_style}]",
            str(w["in_flight"]),
            str(w["completed"]),
            str(w["deaths"]),
            ",".join(w["gpu_ids"]) or "-",
            str(w["pid"]),
        )
    console.print(table)
    uptime = stats["service_uptime_s"]
    console.print(
        f"device {stats['device_name']}; up {uptime / 60:.1f} min; queue depth {stats['queued']},"
        f" in flight {stats['in_flight']}; completed {stats['completed']} of"
        f" {stats['submitted']} submitted; throughput {stats['throughput_per_s'] * 60:.1f}/min"
        f" (last minute {stats['throughput_last_min_per_s'] * 60:.1f}/min)",
        soft_wrap=True,
    )
    console.print(
        f"failures: worker deaths {stats['worker_deaths']}, retried {stats['retried']},"
        f" given up {stats['gave_up']}, hung evaluations {stats['eval_timeouts']},"
        f" batch deadlines {stats['batch_timeouts']}; pre-check rejected"
        f" {stats['precheck_rejected']}",
        soft_wrap=True,
    )
    if "store_path" in stats:
        console.print(
            f"store {stats['store_path']}: {stats['store_results']} results,"
            f" cache hits {stats['cache_hits']}, misses {stats['cache_misses']}",
            soft_wrap=True,
        )
    return 0


def _stop(args: argparse.Namespace) -> int:
    import ray

    from kernelrl.env.pools.service import connect_ray
    from kernelrl.env.service import stop_service

    use_local_ray_token()
    connect_ray(args.address, args.namespace)
    try:
        started = time.monotonic()
        if not stop_service(args.name, args.namespace):
            raise ValueError(f"no environment service named {args.name!r} is running")
        print(f"stopped {args.name!r} in {time.monotonic() - started:.1f} s")
    finally:
        ray.shutdown()
    return 0
