"""One memory budget for what a process keeps across requests (SPEC: MEM-12, MEM-13).

Three structures outlive the request that filled them: the hydration cache (recent stored
contexts, HYD-2), the parking lot (rollouts whose socket closed, PARK-7) and the background
runs' replayable event logs (BG-5). ``--memory-budget`` is what they hold together, in real bytes
(MEM-10); this is its one split. A bound set on its own (``--hydration-cache-bytes``,
``EngineConfig.park_bounds``) wins over its share.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.retained.parking import ParkingBounds

# The shares of the budget (MEM-12): the cache is the largest (every stored response passes
# through it); parked rollouts and background logs are held for a client that comes back.
HYDRATION_SHARE = 0.5
PARKING_SHARE = 0.3
BACKGROUND_SHARE = 0.2
# One API key may hold at most this part of the parking and background shares (MEM-13).
PER_OWNER_PART = 0.25
# The records of an in-memory store (``memory://``, MEM-15), beside the three shares above: the
# other stores hold their records outside this process, so the three shares are what every
# process keeps, and a memory:// process keeps up to this part more.
STORE_SHARE = 0.25


@dataclass(frozen=True)
class MemoryBudget:
    hydration: int  # bytes the hydration cache may hold
    parking: ParkingBounds
    background: int  # bytes all background event logs may hold, live and finished
    background_per_owner: int  # bytes one owner's background logs may hold
    store: int  # bytes an in-memory store's records may hold (MEM-15)

    @classmethod
    def split(
        cls, total: int, hydration: int | None = None, parking: ParkingBounds | None = None
    ) -> MemoryBudget:
        park_bytes = int(total * PARKING_SHARE)
        background = int(total * BACKGROUND_SHARE)
        if parking is None:
            parking = ParkingBounds(
                nbytes=park_bytes, nbytes_per_owner=int(park_bytes * PER_OWNER_PART)
            )
        return cls(
            hydration=int(total * HYDRATION_SHARE) if hydration is None else hydration,
            parking=parking,
            background=background,
            background_per_owner=int(background * PER_OWNER_PART),
            store=int(total * STORE_SHARE),
        )
