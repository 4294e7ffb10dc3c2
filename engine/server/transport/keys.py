"""Typed application keys shared by the server modules."""

from __future__ import annotations

from aiohttp import web

from engine.connection.background import BackgroundRuns
from engine.connection.session import Session
from engine.core import Engine
from engine.inspector.read_model import Inspector
from engine.server.transport.server_config import ServerConfig

ENGINE = web.AppKey("engine", Engine)
SESSIONS = web.AppKey("sessions", set[Session])  # open WebSocket connections
REQUESTS = web.AppKey("requests", set[Session])  # in-flight HTTP creates (for the inspector)
INSPECTOR = web.AppKey("inspector", Inspector)  # the /inspect read model (INSP-1)
MAX_FRAME = web.AppKey("max_frame_bytes", int)
SERVER = web.AppKey("server_config", ServerConfig)
BACKGROUND = web.AppKey("background", BackgroundRuns)  # detached HTTP creates (BG-*)
DRAINING = web.AppKey("draining", list[bool])  # [True] once shutdown began
# [True] from the stop signal on: /healthz answers 503 so a balancer stops routing here, while the
# node still serves for --drain-delay before it stops listening (DRAIN-1, DRAIN-2)
UNREADY = web.AppKey("unready", list[bool])
