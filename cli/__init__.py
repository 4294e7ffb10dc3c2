"""The ``rollout`` command: the one place that sees both sides of the house.

``cli.main`` dispatches ``rollout serve`` to the server (``engine.server.process.flags``,
``engine.server.process.serve``) and ``rollout agent`` / ``rollout bench`` to the clients
(``clients.demo``, ``clients.bench.cli``).
It is the only module allowed to import both the engine and the clients (SPEC: ARCH-1), and it
does nothing else.
"""
