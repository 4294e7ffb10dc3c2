"""``rollout bench``: a client of the server it measures, which it reaches over the wire only.

The coding-agent scenario in four transport modes, plus streaming and memory.

Modules, in the order data flows:

* ``proc``: the server it measures, started as a subprocess through the ``rollout serve`` command
  line (``--bench-models``: the scripted agent looped to any length, a long text answer);
* ``scenario``: the client-side sandbox and real tools (``clients.coding``);
* ``tokens``: the history's size in the server's tokens, counted on the client;
* ``wire`` / ``modes``: the lean measuring client, one code style for all four modes;
* ``measure`` / ``runner``: one rollout per mode and speed, timestamps turned into figures;
* ``stream`` / ``memory``: the streaming-throughput and suspended-memory benchmarks;
* ``report`` / ``table`` / ``plot`` / ``progress``: summaries, targets, terminal, PNG, progress;
* ``cli``: ``add_bench_parser`` and ``run_bench`` for the ``rollout`` command.
"""
