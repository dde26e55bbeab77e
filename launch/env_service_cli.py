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

``serve`` makes a new random bearer token for the service and keeps it in a private file
(``kernelrl.env.pools.service.token_path``; it prints the path, never the token): every client
(``status``, ``stop``, ``ServiceClient``, HTTP) presents it (docs/threat-model.md, "The service").
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
from kernelrl.env.pools.sizing import check_per_gpu
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
        default=EVALS_PER_GPU,
        metadata=_help("evaluations in flight per GPU worker (0: sized from its node)"),
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
        metadata=_help(
            "the service's own tasks (trusted; clients name them by id or send them): 'bundled',"
            " a task folder or task sources as in training (jsonl:FILE, parquet:...,"
            " kernelbench:DIR, disk:...), comma-separated"
        ),
    )
    allow_inline_tasks: bool = field(
        default=False,
        metadata=_help(
            "evaluate tasks clients send that the service does not hold, as untrusted (their"
            " code runs only in the sandbox); off: such a task is refused"
        ),
    )
    max_items_per_request: int = field(
        default=512, metadata=_help("items in one HTTP request (more: 413) or one Ray submit")
    )
    max_client_pending: int = field(
        default=1024, metadata=_help("unresolved items of one client; its next batch waits")
    )
    client_pool_share: int = field(
        default=128,
        metadata=_help("items of one client in the pool at once; the rest wait in the service"),
    )
    client_lease_s: float = field(
        default=30.0,
        metadata=_help("a Ray client not heard from this long is gone: its work is cancelled"),
    )
    http: bool = field(default=True, metadata=_help("serve POST /evaluate with Ray Serve"))
    http_host: str = field(
        default="127.0.0.1",
        metadata=_help(
            "HTTP bind address; another than loopback serves plain HTTP to the network (the"
            " token is required anyway): put a TLS reverse proxy in front"
        ),
    )
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
        from kernelrl.env.pools.service import check_service_name

        check_service_name(self.name)
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be cpu, cuda or auto, got {self.device!r}")
        get_backend(self.backend)
        if self.detach and not self.address:
            raise ValueError(
                "detach needs an address: a local Ray instance ends with `kernelrl env serve`"
            )
        check_per_gpu(self.per_gpu)
        for name in ("max_pending", "http_port"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("http_max_body_mb", "http_body_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        self.limits()  # one-line ValueError for limits that do not fit together

    def limits(self) -> Any:
        from kernelrl.env.service_clients import ClientLimits

        return ClientLimits(
            self.max_items_per_request,
            self.max_client_pending,
            self.client_pool_share,
            self.client_lease_s,
        )

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
    """The service's own tasks, by id: what its operator named (trusted)."""
    from kernelrl.env.task import load_task_folder, task_from_row

    tasks = []
    for source in (s.strip() for s in config.tasks.split(",") if s.strip()):
        if source == "bundled":
            from kernelrl.data.bundled import bundled_tasks

            tasks += bundled_tasks(config.backend)
        elif Path(source).is_dir() and any(Path(source).glob("*.py")):
            tasks += load_task_folder(source, config.backend)
        else:
            from kernelrl.data.loaders import load_tasks

            tasks += [task_from_row(row, config.backend) for row in load_tasks([source])]
    if not tasks:
        raise ValueError(f"tasks {config.tasks!r} names no task")
    return {task.id: task for task in tasks}


def _serve(words: list[str]) -> int:
    config = parse_service_recipe(words)
    tasks = _load_tasks(config)

    from kernelrl.env.pools.ray_workers import init_ray
    from kernelrl.env.pools.service import remove_token, write_token

    token, token_file = write_token(config.name)  # refuses an unsafe file before anything starts
    if not config.address:  # a local Ray of our own: nothing of it may outlive us, even a SIGKILL
        from kernelrl.launch.reaper import start_reaper

        start_reaper()
    started_ray = False
    try:
        started_ray = init_ray(config.address, config.namespace, config.logical_gpus,
                               config.workers, config.precheck_workers)  # fmt: skip
        actor, lines = _start(config, tasks, token, token_file)
    except BaseException:
        _teardown(config, started_ray, token)
        remove_token(config.name, token)
        raise
    # Before the banner: a Ctrl-C the moment it is read stops the service as any other does.
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print("\n".join(lines), flush=True)
    if config.detach:
        return 0
    code = 0
    try:
        while not stop.wait(5.0):
            if not _alive(actor, token):
                # `kernelrl env stop` removes the token file right after stopping the actor:
                # a stop that was asked for ends serve with 0; an actor that died, with 1.
                asked = False
                for _ in range(10):  # the file goes a moment after the actor
                    try:
                        asked = token_file.read_text().strip() != token
                    except OSError:
                        asked = True
                    if asked or stop.wait(1.0):
                        break
                if asked:
                    print(f"environment service {config.name!r} stopped by `kernelrl env stop`")
                    break
                Console(stderr=True).print(f"[red]the service actor {config.name!r} is gone[/red]")
                code = 1
                break
    finally:
        print(f"stopping environment service {config.name!r}", flush=True)
        _teardown(config, started_ray, token)
        remove_token(config.name, token)
    return code


def _start(
    config: EnvServiceConfig, tasks: dict[str, Any], token: str, token_file: Path
) -> tuple[Any, list[str]]:
    """The service actor and its HTTP endpoint on the connected Ray: (the actor, the banner's
    lines)."""
    import ray

    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.service import token_variable
    from kernelrl.env.service import start_service
    from kernelrl.env.service_http import start_http

    store_path = config.resolved_store_path()
    pool_kwargs = {
        "workers": config.workers,
        "per_gpu": config.per_gpu,
        "max_pending": config.max_pending,
        "precheck_workers": config.precheck_workers,
        "max_retries": config.max_retries,
        "batch_timeout_s": config.batch_timeout_s,
    }
    with Console(stderr=True).status(f"starting environment service {config.name!r}..."):
        actor = start_service(
            EvalConfig(device=config.device, timeout_s=config.timeout_s), pool_kwargs,
            store_path, tasks, name=config.name, namespace=config.namespace,
            ready_timeout_s=config.ready_timeout_s, token=token, limits=config.limits(),
            allow_inline_tasks=config.allow_inline_tasks,
        )  # fmt: skip
        info = ray.get(actor.info.remote(token))
        url = None
        if config.http:
            url = start_http(
                token, config.name, config.namespace, config.http_host, config.http_port,
                max_body_bytes=int(config.http_max_body_mb * (1 << 20)),
                body_timeout_s=config.http_body_timeout_s,
            )  # fmt: skip
    address = ray.get_runtime_context().gcs_address
    # Ray enables token authentication on local clusters; a client joining by explicit address
    # must opt in (Ray never sends its token to an address it was merely given).
    auth = "RAY_AUTH_MODE=token " if os.environ.get("RAY_AUTH_MODE") == "token" else ""
    inline = "accepted, untrusted" if config.allow_inline_tasks else "refused"
    lines = [
        f"kernelrl env service {config.name!r} ready: {info['workers']} workers,"
        f" {info['num_slots']} slots on {info['device_name']}; {len(tasks)} named tasks"
        f" (inline tasks {inline}); store {store_path or 'off'}",
        f"  token:       {token_file} (clients read it there, or from ${token_variable(config.name)})",
        f"  Ray clients: ServiceClient(name={config.name!r}, address={address!r},"
        f" namespace={config.namespace!r})",
        f"  status:      {auth}kernelrl env status --address {address} --name {config.name}",
    ]
    if url:
        lines.append(
            f"  HTTP:        POST {url}/evaluate   GET {url}/status"
            "   (header 'Authorization: Bearer <token>')"
        )
        if config.http_host not in ("127.0.0.1", "localhost", "::1"):
            lines.append(
                f"  WARNING:     plain HTTP on {config.http_host}: the token crosses the network"
                " in clear; put a TLS reverse proxy in front (README, environment service)"
            )
    return actor, lines


def _alive(actor: Any, token: str) -> bool:
    import ray
    from ray.exceptions import ActorDiedError, GetTimeoutError, RayError

    try:
        ray.get(actor.info.remote(token), timeout=60)
    except ActorDiedError:
        return False
    except (GetTimeoutError, RayError):  # busy or restarting: not gone
        return True
    return True


def _teardown(config: EnvServiceConfig, started_ray: bool, token: str) -> None:
    import ray

    from kernelrl.env.service import stop_service

    if ray.is_initialized():
        stop_service(token, config.name, config.namespace)
    if config.http and ray.is_initialized():
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
        f"device {stats['device_name']}; up {uptime / 60:.1f} min; {stats['clients']} clients;"
        f" queue depth {stats['queued'] + stats['service_queued']},"
        f" in flight {stats['in_flight']}; completed {stats['completed']} of"
        f" {stats['submitted']} submitted; throughput {stats['throughput_per_s'] * 60:.1f}/min"
        f" (last minute {stats['throughput_last_min_per_s'] * 60:.1f}/min)",
        soft_wrap=True,
    )
    console.print(
        f"failures: worker deaths {stats['worker_deaths']}, retried {stats['retried']},"
        f" given up {stats['gave_up']}, hung evaluations {stats['eval_timeouts']},"
        f" batch deadlines {stats['batch_timeouts']}; pre-check rejected"
        f" {stats['precheck_rejected']}; clients gone {stats['clients_dropped']}"
        f" ({stats['client_items_dropped']} items cancelled)",
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

    from kernelrl.env.pools.service import connect_ray, read_token, remove_token
    from kernelrl.env.service import stop_service

    token = read_token(args.name)
    use_local_ray_token()
    connect_ray(args.address, args.namespace)
    try:
        started = time.monotonic()
        if not stop_service(token, args.name, args.namespace):
            raise ValueError(f"no environment service named {args.name!r} is running")
        remove_token(args.name, token)
        print(f"stopped {args.name!r} in {time.monotonic() - started:.1f} s")
    finally:
        ray.shutdown()
    return 0
