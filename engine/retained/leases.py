"""Background runs' leases (SPEC: LIVE-1, LIVE-2): which node runs a background response, so
that every node reaches the run where it lives (its cancel, its follow: node to node, through
``engine/server/transport/node.py``). The parked rollouts' hand-over is another concept
(``engine/retained/handover.py``); both register this node's address in the shared store, so
leases use the hand-over's address and its bounded background writes.
"""

from __future__ import annotations

from engine.retained.handover import Handover

# A live background run's lease (LIVE-1): ``rollout:parked:run:<id>`` = its node's address,
# written before the create answers and renewed every third of it while the run lives; once
# it ends, kept a while so its event log stays followable from every node (BG-5).
RUN_PREFIX = "run:"
RUN_LEASE_S = 15.0
FINISHED_RUN_S = 120.0


class RunLeases:
    """One per engine; nothing is leased while the node has no address or shares nothing."""

    def __init__(self, node: Handover) -> None:
        self._node = node

    async def hold(self, response_id: str, seconds: float = RUN_LEASE_S) -> None:
        """Hold (or renew) a background run's lease for ``seconds`` (LIVE-1). Raises
        ``StoreError``: a run whose lease cannot be written does not start."""
        node = self._node
        if node.enabled:
            assert node.address is not None
            await node.store.cluster.register_parked(
                RUN_PREFIX + response_id, node.address, seconds
            )

    def finished(self, response_id: str) -> None:
        """The run ended here: its log stays followable from other nodes a while (LIVE-2)."""
        node = self._node
        if node.enabled:
            assert node.address is not None
            key = RUN_PREFIX + response_id
            node.write_later(node.store.cluster.register_parked(key, node.address, FINISHED_RUN_S))

    async def running_at(self, response_id: str) -> str | None:
        """The node holding a background run's lease, None when nobody does (or nothing is
        shared); raises ``StoreError``."""
        if not self._node.enabled:
            return None
        return await self._node.store.cluster.parked_at(RUN_PREFIX + response_id)
