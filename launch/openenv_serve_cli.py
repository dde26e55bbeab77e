"""``kernelrl env openenv-serve``: kernelrl's environment as an OpenEnv server.

    kernelrl env openenv-serve --config recipes/env/openenv_cpu.yaml [--key value ...]

OpenEnv's own server (``HTTPEnvServer``) serves ``KernelEnvironment``: one environment per
WebSocket session (``/ws``, what OpenEnv's ``EnvClient`` speaks), all of them sharing one pool
(``env_pool``: a local pool, Ray, or a running ``kernelrl env serve``). Its recipe has the keys of
the other recipes, spelled the same: the tasks and their prompts as in training (``tasks``,
``task_filter``, ...), the turns (``max_turns``, ``feedback_template``), the reward
(``RewardConfig``'s keys) and the pool (``EnvPoolConfig``'s ``env_*`` keys).

What a client can reach: ``/ws`` (reset, step, state), ``/schema``, ``/metadata``, all behind the
bearer token (made anew at each start, kept where ``kernelrl.env.pools.service.read_token`` finds
it, as ``kernelrl env serve`` keeps its own), and ``/health`` without it. OpenEnv's stateless HTTP ``/reset`` and ``/step`` are
not served (each request would be an episode of its own, useless for multi-turn), nor its MCP
endpoint (this environment has no tools; it would only let a client open sessions outside
``/ws``).
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kernelrl.launch.recipe import add_recipe_command, parse_recipe
from kernelrl.prompts import MultiTurnConfig

if TYPE_CHECKING:  # imported when used: `kernelrl` itself must not import torch or OpenEnv
    from kernelrl.env.pools.base import Pool
    from kernelrl.launch.openenv_env import TaskList
    from kernelrl.rewards import RewardConfig

USAGE = """usage: kernelrl env openenv-serve --config recipes/env/RECIPE.yaml [--key value ...]

Clients (OpenEnv's EnvClient: kernelrl.launch.openenv_env.KernelEnvClient) connect to
ws://HOST:PORT/ws with 'Authorization: Bearer TOKEN'. The server makes a new token at each start
and writes it, mode 0600, where kernelrl.env.pools.service.read_token(NAME) finds it on this
machine ($KERNELRL_HOME/env-NAME.token); elsewhere clients set KERNELRL_OPENENV_TOKEN
(kernelrl.env.pools.service.token_variable(NAME))."""

#: Paths served without the token: a liveness probe learns nothing from it.
OPEN_PATHS = frozenset({"/health"})
MIN_TOKEN_CHARS = 16
#: Largest WebSocket message taken: a step of the longest completion, JSON-escaped.
WS_MAX_BYTES = 4 * 2**20


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class OpenEnvServeConfig(MultiTurnConfig):
    """Where the server listens, how many sessions it holds, and its tasks (the keys of a
    training recipe's task selection)."""

    name: str = field(
        default="kernelrl-openenv", metadata=_help("the name clients read the token under")
    )
    host: str = field(default="127.0.0.1", metadata=_help("bind address"))
    port: int = field(default=8200, metadata=_help("port (8000: vLLM, 8100: kernelrl env serve)"))
    max_sessions: int = field(default=64, metadata=_help("WebSocket sessions open at once"))
    session_timeout_s: float | None = field(
        default=3600.0, metadata=_help("a session idle this long is closed (none: never)")
    )
    tasks: list[str] = field(
        default_factory=lambda: ["bundled"],
        metadata=_help("task sources: 'bundled' or loader specs (jsonl:FILE, hub:ORG/NAME, ...)"),
    )
    task_filter: str = field(default="", metadata=_help("comma-separated substrings of task ids"))
    task_categories: str = field(default="", metadata=_help("comma-separated categories to keep"))
    task_difficulty: str = field(default="", metadata=_help("comma-separated difficulty tags"))
    max_tasks: int | None = field(default=None, metadata=_help("keep the first N tasks"))
    task_backend: str = field(default="triton", metadata=_help("triton or cuda"))
    prompt_template: str | None = field(default=None, metadata=_help("prompt template file"))
    system_prompt: str | None = field(
        default="default", metadata=_help("'default', a system message, or 'none'")
    )

    def __post_init__(self) -> None:
        from kernelrl.env.pools.service import check_service_name

        self.check_turns()
        check_service_name(self.name)
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {self.max_sessions}")
        if self.session_timeout_s is not None and self.session_timeout_s <= 0:
            raise ValueError("session_timeout_s must be positive (or none)")


def recipe_types() -> tuple[type, ...]:
    """The recipe's dataclasses: the server, the pool (``env_*``) and the reward."""
    from kernelrl.env.pools.factory import EnvPoolConfig
    from kernelrl.rewards import RewardConfig

    return (OpenEnvServeConfig, EnvPoolConfig, RewardConfig)


def add_subcommand(env_commands: Any) -> None:
    """Adds ``openenv-serve`` to the ``kernelrl env`` subcommands."""
    add_recipe_command(
        env_commands,
        "openenv-serve",
        help="serve the environment to OpenEnv clients (WebSocket, bearer token)",
        run=_serve,
        recipe_types=recipe_types,
        usage=USAGE,
    )


class BearerToken:
    """ASGI middleware: every HTTP request and WebSocket handshake carries
    ``Authorization: Bearer <token>`` or is refused (401; a WebSocket is closed with 1008
    before it is accepted). Compared in constant time."""

    def __init__(self, app: Callable, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, scope: dict[str, Any]) -> bool:
        if scope.get("path") in OPEN_PATHS:
            return True
        headers = dict(scope.get("headers") or [])
        return hmac.compare_digest(headers.get(b"authorization", b""), self._expected)

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "websocket" and self._allowed(scope):
            from starlette.websockets import WebSocketDisconnect

            # openenv-core 0.3.0 closes a session's socket after its client left and lets the
            # disconnect escape (an ERROR traceback per episode); the session is gone by then.
            with contextlib.suppress(WebSocketDisconnect):
                await self.app(scope, receive, send)
            return
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await receive()  # the handshake's websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": "bearer token"})
            return
        from starlette.responses import JSONResponse

        refusal = JSONResponse(
            {"error": "missing or wrong bearer token"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await refusal(scope, receive, send)


def build_app(
    pool: Pool,
    tasks: TaskList,
    token: str,
    *,
    turns: MultiTurnConfig | None = None,
    reward: RewardConfig | None = None,
    max_sessions: int = 64,
    session_timeout_s: float | None = 3600.0,
) -> Any:
    """The FastAPI app: OpenEnv's WebSocket server over ``KernelEnvironment`` sessions sharing
    ``pool`` (the caller closes it), behind the bearer token."""
    from fastapi import FastAPI
    from openenv.core.env_server import HTTPEnvServer
    from openenv.core.env_server.types import ConcurrencyConfig, ServerMode

    from kernelrl.launch.openenv_env import KernelAction, KernelEnvironment, KernelObservation

    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the bearer token must have at least {MIN_TOKEN_CHARS} characters")
    factory = functools.partial(
        KernelEnvironment, pool, tasks, turns=turns or MultiTurnConfig(), reward=reward
    )
    server = HTTPEnvServer(
        factory,
        KernelAction,
        KernelObservation,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=max_sessions, session_timeout=session_timeout_s
        ),
    )
    app = FastAPI(title="kernelrl environment (OpenEnv)", docs_url=None, redoc_url=None)
    server.register_routes(app, mode=ServerMode.PRODUCTION)
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", "") != "/mcp"]
    app.add_middleware(BearerToken, token=token)
    return app


def task_list(config: OpenEnvServeConfig) -> TaskList:
    """The recipe's tasks with the prompts training would give them."""
    from kernelrl.launch.openenv_env import TaskList
    from kernelrl.launch.train_cli import build_task_dataset

    return TaskList.from_rows(list(build_task_dataset(config)))


@dataclass
class RunningServer:
    """A server started by ``serve_in_thread``: its address, and ``stop``."""

    url: str
    server: Any
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Run ``app`` with uvicorn in a daemon thread of this process (``port`` 0: any free one);
    returns once it accepts connections."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", ws_max_size=WS_MAX_BYTES
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="openenv-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the OpenEnv server did not start on {host}:{port}")
        time.sleep(0.05)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningServer(f"http://{host}:{bound}", server, thread)


def _serve(words: list[str]) -> int:
    import uvicorn

    from kernelrl.env.pools.service import remove_token, write_token

    config, pool_config, reward = parse_recipe(words, recipe_types(), "kernelrl env openenv-serve")
    tasks = task_list(config)
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again: here it ends
    # this command through the cleanup below (the token file removed, the pool closed).
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stopped)
    with contextlib.suppress(_Stopped), contextlib.ExitStack() as cleanup:
        token, token_file = write_token(config.name)  # refuses an unsafe file, before anything
        cleanup.callback(remove_token, config.name, token)
        pool = pool_config.make_pool()
        cleanup.callback(pool.close)
        app = build_app(
            pool,
            tasks,
            token,
            turns=config,
            reward=reward,
            max_sessions=config.max_sessions,
            session_timeout_s=config.session_timeout_s,
        )
        banner = (
            f"kernelrl OpenEnv environment on ws://{config.host}:{config.port}/ws: "
            f"{len(tasks)} task{'s' * (len(tasks) != 1)}, up to {config.max_turns} turns, "
            f"pool {pool_config.env_pool} "
            f"({pool.num_slots} slots on {pool.device_name}); bearer token in {token_file} "
            f"(read_token({config.name!r}))"
        )
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=config.host,
                port=config.port,
                log_level="warning",
                ws_max_size=WS_MAX_BYTES,
            )
        )
        threading.Thread(target=_announce, args=(server, banner), daemon=True).start()
        server.run()  # until Ctrl-C or SIGTERM
    print("kernelrl OpenEnv environment stopped", file=sys.stderr)
    return 0


def _announce(server: Any, banner: str) -> None:
    """Print the banner once the server accepts connections (a client may connect at once)."""
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.started:
        print(banner, flush=True)


class _Stopped(Exception):
    """SIGINT or SIGTERM, once uvicorn has shut down."""


def _stopped(signum: int, frame: Any) -> None:
    raise _Stopped()
