"""``python -m engine.bench``: the same as ``rollout bench``."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from engine.bench.cli import main

    sys.exit(main())
