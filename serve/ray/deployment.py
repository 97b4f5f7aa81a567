"""tallow serve --ray: one model as a Ray Serve application (docs/DESIGN.md, "Serving on Ray").

- `ModelReplica`, the model's deployment: each replica loads one engine on its node (the
  weights found as a batch actor finds them, runtime/node_weights.py) and answers with the
  runner's own app (serve/runner/runner_app.py), called in process: every API, every check,
  the same answers as `tallow serve`.
- `Ingress`, one light replica behind Ray Serve's HTTP proxy: it reads the body, computes
  the prefix affinity key (wire/affinity.py) and calls the model's deployment through a
  streaming handle, passing the key where the router sees it.
- `AffinityRouter`: requests with a key go to the replica that key hashes to (rendezvous
  over the running replicas, so a replica that goes away moves only its own keys), the
  others to any, and Ray Serve falls back to the next rank when that replica is full.
Readiness is Ray Serve's: a replica takes requests once its constructor (the engine's load)
has returned; `check_health` fails a replica whose engine thread has died, and Ray Serve
replaces it. Drain is Ray Serve's graceful shutdown: a replica being stopped gets no new
requests and its requests in flight finish, for up to the deployment's
graceful_shutdown_timeout_s (serve --drain-timeout).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import StreamingResponse

from tallow.runtime.node_weights import WeightFile, load_on_node, node_name
from tallow.runtime.types import LoadSettings, SchedulerSettings
from tallow.serve.config import ServerConfig
from tallow.serve.runner.runner_app import create_app
from tallow.wire.affinity import affinity_key


@dataclass(frozen=True)
class ReplicaSpec:
    model_paths: tuple[str, ...]  # the driver's paths of the model's shards (keys of `weights`)
    weights: dict[str, WeightFile]
    load: LoadSettings
    sched: SchedulerSettings
    server: ServerConfig  # the runner app's: the model's name, limits, key, CORS


class ModelReplica:
    def __init__(self, spec: ReplicaSpec) -> None:
        import ray

        self.node = node_name(ray)
        self.sched, self.sources = load_on_node(spec.model_paths, spec.weights, spec.load, spec.sched, self.node,
                                                ray.get)
        self.app = create_app(self.sched, spec.server)

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine has stopped is replaced."""
        if not self.sched.alive():
            raise RuntimeError(f"the engine on {self.node} has stopped")

    async def handle(self, method: str, path: str, query: bytes, headers: list, body: bytes, affinity: str | None):
        """The runner app's answer to one request: first ("start", status, headers), then
        the body's chunks as the app sends them (a stream's events as they come)."""
        del affinity  # for the router
        sent: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()  # the client went away (this generator was closed)
            return {"type": "http.disconnect"}

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "",
                 "headers": [(bytes(k), bytes(v)) for k, v in headers], "client": ("127.0.0.1", 0),
                 "server": ("127.0.0.1", 0)}
        task = asyncio.ensure_future(self.app(scope, receive, sent.put))
        try:
            while True:
                message = await _next(sent, task)
                if message is None:
                    return
                if message["type"] == "http.response.start":
                    yield ("start", message["status"], [(bytes(k), bytes(v)) for k, v in message.get("headers", [])])
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield bytes(message["body"])
                    if not message.get("more_body"):
                        return
        finally:
            gone.set()
            if not task.done():
                try:
                    await asyncio.wait_for(task, 5)
                except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - the client is gone either way
                    task.cancel()

    def __del__(self) -> None:
        sched = getattr(self, "sched", None)
        if sched is not None:
            sched.close()


async def _next(sent: asyncio.Queue, task: asyncio.Future):
    """The app's next message, or None when it ended without one (its error re-raised)."""
    getter = asyncio.ensure_future(sent.get())
    done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    if not sent.empty():
        return sent.get_nowait()
    task.result()
    return None


class Ingress:
    def __init__(self, model, affinity_chars: int) -> None:
        self.model, self.affinity_chars = model, affinity_chars

    async def __call__(self, request: Request) -> StreamingResponse:
        body = await request.body()
        key = None
        if body and request.method == "POST":
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                key = affinity_key(parsed, self.affinity_chars)
        stream = self.model.options(stream=True).handle.remote(
            request.method, request.url.path, request.url.query.encode(), list(request.headers.raw), body,
            affinity=key)
        _, status, headers = await stream.__anext__()

        async def rest():
            async for chunk in stream:
                yield chunk

        response = StreamingResponse(rest(), status_code=status)
        response.raw_headers = headers
        return response


class AffinityRouter(FIFOMixin, RequestRouter):
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        key = pending_request.kwargs.get("affinity") if pending_request is not None else None
        if not key or len(candidate_replicas) < 2:
            return [candidate_replicas]
        ranked = sorted(candidate_replicas, reverse=True,
                        key=lambda r: hashlib.sha256(f"{key}|{r.replica_id.unique_id}".encode()).digest())
        return [ranked[:1], ranked[1:]]
