"""What test modules share (issue 18 §5): the live server, WebSocket reading, the common tools,
the SDK client fixtures, the conformance oracle and condition waits.

A test module imports helpers from here (or from a non-test module beside it), never from
another ``test_*.py`` module; ``tests/test_floors.py`` checks that (TEST-1).
"""
