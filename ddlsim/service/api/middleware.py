"""What wraps every request: the body limit (413) and the Prometheus metrics (requests by
route and status, their latency, the queue's tasks by kind and status)."""

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ddlsim.data.store.tasks import TaskQueue

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
CallNext = Callable[[Request], Awaitable[Response]]


class Metrics:
    """An app's metrics, in a registry of its own (so that apps in one process do not
    share counts)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ddlsim_http_requests",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ddlsim_http_request_seconds",
            "HTTP request latency",
            ["route"],
            registry=self.registry,
        )
        self.tasks = Gauge(
            "ddlsim_tasks", "tasks in the queue", ["kind", "status"], registry=self.registry
        )

    async def count(self, request: Request, call_next: CallNext) -> Response:
        """HTTP middleware: counts the request by its route's path (not the URL, which would
        make a label per id) and times it."""
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        self.requests.labels(request.method, path, str(response.status_code)).inc()
        self.latency.labels(path).observe(time.perf_counter() - started)
        return response

    def exposition(self, queue: TaskQueue) -> str:
        """The text exposition format, the queue's counts read now."""
        self.tasks.clear()
        for (kind, status), n in queue.counts().items():
            self.tasks.labels(kind, status).set(n)
        return generate_latest(self.registry).decode()


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes (413), by their Content-Length or as they
    stream in."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLargeError
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLargeError:
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        body = json.dumps(
            {"error": f"request body over {self.limit} bytes", "field": "body"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLargeError(Exception):
    pass
