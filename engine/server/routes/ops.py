"""The operator's routes: readiness, the model list, Prometheus metrics, the debug counters and
the benchmark's stage timings (DRAIN-1, OBS-1, OBS-5, AUTH-11)."""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from engine.core import Engine
from engine.observe.metrics import CONTENT_TYPE
from engine.server.transport.http import error_response, json_response
from engine.server.transport.keys import BACKGROUND, DRAINING, ENGINE, SESSIONS, UNREADY
from protocol.errors import Unavailable


async def healthz(request: web.Request) -> web.Response:
    """Readiness (DRAIN-1): 200 while the node takes new work, 503 from the stop signal on, so
    a balancer's health check takes a draining node out of rotation."""
    if request.app[UNREADY][0] or request.app[DRAINING][0]:
        return error_response(
            Unavailable("server_shutting_down", "The server is shutting down.", None)
        )
    return json_response({"status": "ok"})


async def list_models(request: web.Request) -> web.Response:
    """Every routable name: models, their aliases and the default route's name. ``owned_by``
    names the backend kind (``sim``, ``chat``, ``responses``)."""
    router = request.app[ENGINE].router
    data = []
    for name in router.models():
        backend = router.backend_of(name)
        owner = backend.name if backend is not None else "rollout"
        data.append({"id": name, "object": "model", "created": 0, "owned_by": owner})
    return json_response({"object": "list", "data": data})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition: stage histograms, responses, tokens, findings, cache events."""
    engine: Engine = request.app[ENGINE]
    return web.Response(body=engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def stats(request: web.Request) -> web.Response:
    """Counters for operators and tests: stage runs, cache paths, post-inference runs."""
    engine: Engine = request.app[ENGINE]
    await asyncio.sleep(0)
    return json_response(
        {
            "stage_runs": dict(engine.stats.runs),
            "stage_items": dict(engine.stats.items),
            "tokens_rendered": engine.stats.tokens_rendered,
            "counters": dict(engine.counters),
            "post_inference_runs": engine.post.runs,
            "router_resolutions": engine.router.resolutions,
            "backends": _backend_stats(engine),
            "open_sessions": len(request.app[SESSIONS]),
            "store": {"kind": engine.store.kind, "available": engine.store.available},
            "hydration_cache": {"entries": len(engine.hydrated), "bytes": engine.hydrated.nbytes},
            "parked": len(engine.parking),
            # what the memory budget's parts hold now, bytes (MEM-12, MEM-15): the soak's
            # RSS series is read beside it (LIVE-9)
            "budget_held": {
                "hydration": engine.hydrated.nbytes,
                "parking": engine.parking.nbytes,
                "background": request.app[BACKGROUND].budget.nbytes,
                "store": engine.store.held_bytes,
            },
            "pid": os.getpid(),  # which worker answered (WORK-1)
        }
    )


def _backend_stats(engine: Engine) -> dict[str, dict[str, int]]:
    """Upstream backends' counters (requests, dropped items, estimated usage), listed once per
    backend under its first route name (aliases share the backend)."""
    out: dict[str, dict[str, int]] = {}
    seen: set[int] = set()
    for name, backend in sorted(engine.router.routes.items()):
        counters = backend.stats
        if counters is not None and id(backend) not in seen:
            seen.add(id(backend))
            out[name] = dict(counters)
    return out


async def bench_timings(request: web.Request) -> web.Response:
    """``GET /v1/bench/timings`` (``--bench-timings`` only, OBS-5): the per-turn records so
    far, oldest first; they are handed over once (the list is cleared)."""
    engine: Engine = request.app[ENGINE]
    if engine.bench_clock is None:
        raise web.HTTPNotFound()
    return json_response({"object": "list", "data": engine.bench_clock.take()})


def register(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/debug/stats", stats)
    app.router.add_get("/metrics", metrics)
    if app[ENGINE].bench_clock is not None:  # rollout serve --bench-timings (OBS-5)
        app.router.add_get("/v1/bench/timings", bench_timings)
