"""Model routing: model name or alias -> backend (SPEC: PIPE-5). Resolved once per rollout."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from engine.models.base import Backend
from engine.models.sim.simulator import SimulatedModel


@dataclass
class Router:
    """A routing table. Unknown model names go to ``default`` (the simulator by default).

    ``default_name`` is the name listed for the default route in ``GET /v1/models``;
    ``closers`` release what the routes hold (the shared upstream HTTP pool) on shutdown.
    """

    routes: dict[str, Backend] = field(default_factory=dict)
    default: Backend | None = None
    resolutions: int = 0
    default_name: str | None = None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def resolve(self, model: str) -> Backend:
        self.resolutions += 1
        backend = self.routes.get(model) or self.default
        if backend is None:
            from protocol.errors import InvalidRequest

            raise InvalidRequest("model_not_found", f"The model '{model}' does not exist.", "model")
        return backend

    def models(self) -> list[str]:
        names = set(self.routes)
        if self.default_name is not None:
            names.add(self.default_name)
        return sorted(names)

    def backend_of(self, model: str) -> Backend | None:
        return self.routes.get(model) or (self.default if model == self.default_name else None)

    def backends(self) -> list[Backend]:
        """Each distinct backend once (aliases share one)."""
        seen: dict[int, Backend] = {}
        for backend in [*self.routes.values(), self.default]:
            if backend is not None:
                seen.setdefault(id(backend), backend)
        return list(seen.values())

    async def aclose(self) -> None:
        for close in self.closers:
            await close()


def simulator_router(tokens_per_second: float) -> Router:
    """The embedded default: ``sim`` for any model name, plus the scripted scenarios."""
    sim = SimulatedModel(tokens_per_second)
    coding = SimulatedModel(tokens_per_second, scenario="coding-agent")
    return Router(routes={"sim": sim, "sim-coding-agent": coding}, default=sim, default_name="sim")
