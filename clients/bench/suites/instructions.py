"""``rollout bench --peers --peers-callgrind`` (BENCH-12): instructions per turn, counted.

On a shared machine a server's CPU time per turn moves by ±10% from run to run, more than most
single optimisations save. ``valgrind --tool=callgrind`` counts the instructions a process
executes instead: the same binary, inputs and environment give the same count whatever else the
machine is doing. Each target runs under callgrind with instrumentation off (start-up is not
counted); around each measured chain ``callgrind_control`` switches it on, and after the chain
dumps the counters (which zeroes them) and switches it off. The dump's total over the chain's
turns is that chain's instructions per turn.

Instructions are not time (a Python interpreter and compiled Rust retire instructions at
different rates per cycle), so the figure compares a change against its baseline on one
target, and one target against another only beside the CPU figures of an uncounted run. Under
callgrind a process runs 30-60x slower and its threads one at a time: that run's wall and CPU
columns say nothing. A target whose work happens in child processes (LiteLLM's workers) is not
counted: callgrind follows no children.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

COUNTED = ("engine", "engine-chat", "agentic-api", "smg")  # the serving process is the one started


class CallgrindUnavailable(RuntimeError):
    """valgrind or callgrind_control is not installed."""


def check_tools() -> None:
    missing = [t for t in ("valgrind", "callgrind_control") if shutil.which(t) is None]
    if missing:
        raise CallgrindUnavailable(
            f"--peers-callgrind needs {' and '.join(missing)} (Debian's valgrind package)"
        )


class Callgrind:
    """One target's counter: wraps its command, counts one chain at a time."""

    def __init__(self, work: Path, name: str) -> None:
        self.base = work / f"{name}.callgrind"
        self._seen: set[Path] = set()

    def wrap(self, command: list[str]) -> list[str]:
        return [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={self.base}.%p", *command,
        ]  # fmt: skip

    async def begin(self, pid: int) -> None:
        await _control("-z", pid)  # nothing before the chain counts
        await _control("-i", pid, "on")

    async def end(self, pid: int) -> int:
        """The instructions since ``begin``."""
        await _control("-d", pid)
        await _control("-i", pid, "off")
        dumps = sorted(set(self.base.parent.glob(self.base.name + ".*")) - self._seen)
        self._seen.update(dumps)
        return sum(_total(path) for path in dumps)


async def _control(flag: str, pid: int, *value: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control", flag, *value, str(pid),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind_control {flag} failed: {err.decode(errors='replace')[:200]}")


def _total(path: Path) -> int:
    """A dump's event total (its ``totals:`` or ``summary:`` line; Ir is the first event)."""
    total = 0
    with path.open("rb") as dump:
        for line in dump:
            if line.startswith((b"totals:", b"summary:")):
                total = max(total, int(line.split()[1]))
    return total
