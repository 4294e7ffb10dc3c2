"""Server bugs the fuzzers found that are not fixed yet (none at the moment).

When a fuzz run finds a bug: add a deterministic reproduction to ``test_regressions.py`` marked
``@pytest.mark.xfail(reason="BUG: <diagnosis>", strict=True)``, and, if the state machines
would otherwise keep tripping over it, a flag here, e.g. ``SOME_BUG = True``, that the machines
consult to predict the current (buggy) behaviour for that one case or to not generate its
trigger, so they keep checking everything else. When the engine is fixed the regression test
XPASSes (strict: it fails), and the mark and the flag are removed together.

Found and fixed so far (see ``test_regressions.py``): the builder's phantom open item after an
illegal add (STATE-2); deeply nested frames killing the socket / HTTP 500; inject.failed and
steer.failed echoing input the SDK rejects (CONF-1); store-path error params offset by the
stored context; not-JSON reported as a schema error (CODEC-2); ``metadata[...]`` params.
Found and fixed in the model (the server was right): the WS machine took a queued create's
``duplicate_tool_output`` for a double append's error (issue 13; WS-5, APPEND-5).
"""

from __future__ import annotations
