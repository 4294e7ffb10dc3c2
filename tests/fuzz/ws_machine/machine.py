"""The composed machine: every rule group, the event tracking, and the teardown."""

from __future__ import annotations

from typing import Any

from tests.fuzz._support import (
    validate_recorded,
)
from tests.fuzz.ws_machine.appends import AppendRules
from tests.fuzz.ws_machine.bad_frames import BadFrameRules
from tests.fuzz.ws_machine.connections import ConnectionRules
from tests.fuzz.ws_machine.creates import CreateRules
from tests.fuzz.ws_machine.events import EventTracking
from tests.fuzz.ws_machine.injects import InjectRules
from tests.fuzz.ws_machine.model import (
    Create,
    LaneModel,
)
from tests.fuzz.ws_machine.steering import SteeringRules


class WsProtocolMachine(
    CreateRules,
    AppendRules,
    InjectRules,
    BadFrameRules,
    ConnectionRules,
    SteeringRules,
    EventTracking,
):
    """The whole machine: every rule group over one tracked connection at a time."""

    # ================================================================== teardown
    def teardown(self) -> None:
        try:
            if self.conn is not None and not self.broken:
                self._probe()
                self._retire_appends()
                self._disconnect()
                self._check_store()
        finally:
            if self.conn is not None:
                self.env.run(self.conn.close())
            validate_recorded(self.recorded_start)

    def _probe(self) -> None:
        """The socket is still usable after everything that happened (ERR-4)."""
        lane = self.lanes[None]
        target = None if lane.busy is None and not lane.queue else "probe"
        if target is not None and target not in self.lanes:
            self.lanes[target] = LaneModel()
        body: dict[str, Any] = {"type": "response.create", "input": "probe", "generate": False}
        if target is not None:
            body["stream_id"] = target
        self._submit(Create(target, body))
