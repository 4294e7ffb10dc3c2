"""``python -m clients.bench``: the same as ``rollout bench``."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from clients.bench.cli import main

    sys.exit(main())
