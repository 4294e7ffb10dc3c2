"""``rollout bench``: the coding-agent scenario in four transport modes, plus streaming and memory.

Modules, in the order data flows:

* ``server`` / ``proc``: the production engine and app in a subprocess, with bench models routed
  in (``backends``: the scripted agent looped to any length, a long text answer);
* ``scenario``: the client-side sandbox and real tools (``clients.coding``);
* ``wire`` / ``modes``: the lean measuring client, one code style for all four modes;
* ``measure`` / ``runner``: one rollout per mode and speed, timestamps turned into figures;
* ``stream`` / ``memory``: the streaming-throughput and suspended-memory benchmarks;
* ``report`` / ``table`` / ``plot`` / ``progress``: summaries, targets, terminal, PNG, progress;
* ``cli``: ``add_bench_parser`` and ``run_bench`` for the ``rollout`` command.
"""
