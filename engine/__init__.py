"""The rollout engine: one asyncio coroutine per agentic rollout, behind protocol-neutral sessions.

Imports ``protocol``; knows nothing of aiohttp (that lives in ``engine.server``).
"""
