"""``python -m cli``: the same as the ``rollout`` command (how the bench starts its server)."""

from __future__ import annotations

import sys

from cli.main import main

if __name__ == "__main__":
    sys.exit(main())
