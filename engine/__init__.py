"""The rollout engine: one asyncio coroutine per agentic rollout, behind protocol-neutral sessions.

Imports ``protocol``. It knows nothing of the aiohttp *server*: the HTTP and WebSocket transports
live in ``engine.server``. The upstream model backends (``engine.models.upstreams.endpoint``) do use
aiohttp's HTTP *client* to reach the model servers they stand for.
"""
