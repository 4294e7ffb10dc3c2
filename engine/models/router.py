"""Model routing: model name or alias -> backend (SPEC: PIPE-5). Resolved once per rollout."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.models.base import Backend
from engine.models.sim import SimulatedModel


@dataclass
class Router:
    """A routing table. Unknown model names go to ``default`` (the simulator by default)."""

    routes: dict[str, Backend] = field(default_factory=dict)
    default: Backend | None = None
    resolutions: int = 0

    def resolve(self, model: str) -> Backend:
        self.resolutions += 1
        backend = self.routes.get(model) or self.default
        if backend is None:
            from protocol.errors import InvalidRequest

            raise InvalidRequest("model_not_found", f"The model '{model}' does not exist.", "model")
        return backend

    def models(self) -> list[str]:
        return sorted(self.routes)


def simulator_router(tokens_per_second: float = 1000.0) -> Router:
    """The embedded default: ``sim`` for any model name, plus the scripted scenarios."""
    sim = SimulatedModel(tokens_per_second)
    coding = SimulatedModel(tokens_per_second, scenario="coding-agent")
    return Router(routes={"sim": sim, "sim-coding-agent": coding}, default=sim)
