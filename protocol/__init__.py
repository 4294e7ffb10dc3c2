"""Wire protocol of the rollout engine: pure data models, codec, stream builder, state machines.

Nothing in this package performs I/O or imports asyncio, aiohttp or ``engine``; a test enforces
it (SPEC: ARCH-1). Everything here is usable and testable synchronously.
"""
