"""The HTTP endpoint of the environment service: Ray Serve in front of the service actor.

Why a separate module: the endpoint is the service's face to clients outside Ray, the one place
that must hold against any bytes a network peer sends. Every route asks for the service's
bearer token first (401 otherwise, before the body is read), then bounds the body in size and
time, and only then forwards JSON to the actor, which checks the token again (it is callable
from Ray too) and owns all evaluation. Plain HTTP: on a cluster, TLS belongs to a reverse proxy
in front (docs/threat-model.md, "The service").
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from kernelrl.env.pools.service import NAMESPACE, SERVICE_NAME, token_digest, token_matches

HTTP_APP_NAME = "kernelrl-env-http"
UNAUTHORIZED = "missing or wrong bearer token (send 'Authorization: Bearer <the service token>')"


def start_http(
    token: str,
    name: str = SERVICE_NAME,
    namespace: str = NAMESPACE,
    host: str = "127.0.0.1",
    port: int = 8100,
    max_body_bytes: int = 8 << 20,
    body_timeout_s: float = 30.0,
) -> str:
    """Ray Serve in front of the service actor: ``POST /evaluate`` and ``GET /status``, both
    for holders of ``token`` only (``Authorization: Bearer``; 401 with a JSON error without).

    The deployment only forwards JSON to the actor, so HTTP clients share the same pool, queue
    and results cache as Ray clients. It also keeps one client from hurting the others: a body
    over ``max_body_bytes`` is refused (413) before it is read, one that has not arrived
    ``body_timeout_s`` after the request started is refused (408: a client trickling its body
    holds nothing for long), and a client that disconnects has its evaluation cancelled. A
    service that is down or restarting is answered 503 with ``Retry-After``: retry the same
    request (the results store answers it if it was evaluated meanwhile). Returns the base URL.
    """
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
    class EnvHTTP:
        def __init__(self, service_name: str, service_namespace: str, digest: bytes) -> None:
            import ray

            self.service = ray.get_actor(service_name, namespace=service_namespace)
            self.digest = digest

        async def __call__(self, request: Request) -> JSONResponse:
            token = bearer_token(request.headers.get("authorization"))
            if not token_matches(token, self.digest):
                headers = {"WWW-Authenticate": 'Bearer realm="kernelrl-env"', "Connection": "close"}
                return JSONResponse({"error": UNAUTHORIZED}, 401, headers=headers)
            path = request.url.path.rstrip("/")
            if request.method == "GET" and path.endswith("/status"):
                return await self._forward(self.service.stats.remote(token), lambda s: (200, s))
            if request.method == "POST" and path.endswith("/evaluate"):
                body = await read_json_body(request, max_body_bytes, body_timeout_s)
                if isinstance(body, JSONResponse):
                    return body
                ref = self.service.evaluate_request.remote(token, body)
                return await self._forward(ref, tuple)
            return JSONResponse({"error": "use POST /evaluate or GET /status"}, 404)

        async def _forward(self, ref: Any, answer: Any) -> JSONResponse:
            import ray

            try:
                code, payload = answer(await ref)
            except asyncio.CancelledError:  # the client disconnected: its work is not wanted
                ray.cancel(ref)
                raise
            except ray.exceptions.RayActorError as exc:  # dead, restarting or unreachable
                why = f"the environment service is unavailable ({type(exc).__name__}); retry"
                return JSONResponse(
                    {"error": why, "retryable": True}, 503, headers={"Retry-After": "5"}
                )
            return JSONResponse(payload, code)

    serve.start(http_options={"host": host, "port": port})
    serve.run(EnvHTTP.bind(name, namespace, token_digest(token)), name=HTTP_APP_NAME,
              route_prefix="/")  # fmt: skip
    url = f"http://{host}:{port}"
    wait_for_route(url, token)
    return url


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None for any other form)."""
    scheme, _, token = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def wait_for_route(url: str, token: str, timeout_s: float = 120.0) -> None:
    """Return once ``GET /status`` is answered by our app, not by the proxy alone.

    Ray Serve's proxy listens before its route table holds the app that ``serve.run`` just
    deployed, and answers ``404 Path not found`` meanwhile; a service announced ready then would
    refuse its first clients. Raises TimeoutError naming the last answer."""
    import urllib.error
    import urllib.request

    host, port = url.removeprefix("http://").rsplit(":", 1)
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: ask on loopback
        host = "127.0.0.1"
    request = urllib.request.Request(
        f"http://{host}:{port}/status", headers={"Authorization": f"Bearer {token}"}
    )
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                json.loads(answer.read())
                return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise TimeoutError(f"the HTTP endpoint {url} did not serve /status in {timeout_s:g} s ({last})")


async def read_json_body(request: Any, max_bytes: int, timeout_s: float) -> Any:
    """The JSON body of a starlette request, or the JSONResponse refusing it: 413 over
    ``max_bytes`` (by its Content-Length, before reading, or as it arrives), 408 when it is not
    all there within ``timeout_s``, 400 when it is not JSON. Bounded in time and memory whatever
    the client sends."""
    from starlette.responses import JSONResponse

    close = {"Connection": "close"}  # what is left of the body is not read
    too_large = JSONResponse(
        {"error": f"the request body is over the limit of {max_bytes} bytes"}, 413, headers=close
    )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        return too_large
    chunks: list[bytes] = []

    async def receive() -> bool:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                return False
            chunks.append(chunk)
        return True

    try:
        if not await asyncio.wait_for(receive(), timeout_s):
            return too_large
    except TimeoutError:
        why = f"the request body did not arrive within {timeout_s:g} s"
        return JSONResponse({"error": why, "retryable": True}, 408, headers=close)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, too deep
        return JSONResponse({"error": "the request body must be JSON"}, 400)


def stop_http() -> None:
    try:
        from ray import serve

        serve.delete(HTTP_APP_NAME)
    except Exception:  # Serve not installed or not running: nothing to stop
        return
