"""The suite's hooks: the hypothesis seed, the SDK conformance oracle, the shared fixtures.

Every event the server writes during a test (WebSocket frames and SSE events) is recorded and,
at teardown, parsed with the official ``openai`` SDK's event models (CONF-1). Our experimental
extension events (``response.done``) are checked against our own schema instead. Every event and
every HTTP JSON body is also checked against the Open Responses required-field tables
(``tests/conformance/open_responses.py``, CONF-3). The recorder and the checks are in
``tests/support/oracle.py``; the fixtures (``server``, ``server_factory``, ``client``) in
``tests/support/fixtures.py``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support.oracle import BODIES, RECORDED, open_responses_faults, sdk_parse

pytest_plugins = ("tests.support.fixtures",)

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# ----------------------------------------------------------------------------- hypothesis seed

_SEED = pytest.StashKey[str]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Every run has one hypothesis seed, and it is visible: ``--hypothesis-seed`` if given
    (``make fuzz SEED=…`` passes it), otherwise a fresh random one, so each run still explores
    new sequences (FUZZ-6). It is shown in the header, beside every failure and in the summary
    of a failed run; ``--hypothesis-seed=<seed>`` replays the run's generation."""
    seed = config.getoption("hypothesis_seed")
    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    if seed is None and worker is not None:  # a pytest-xdist worker: the controller's seed
        seed = worker["hypothesis_seed"]
        config.option.hypothesis_seed = seed
        from hypothesis import core

        core.global_force_seed = int(seed)  # type: ignore[assignment]
    if seed is None:
        seed = str(secrets.randbits(32))
        config.option.hypothesis_seed = seed
        from hypothesis import core  # in case hypothesis' own configure hook ran first

        core.global_force_seed = int(seed)  # type: ignore[assignment]
    config.stash[_SEED] = str(seed)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker generates from the one seed the header shows (FUZZ-6)."""
    node.workerinput["hypothesis_seed"] = node.config.stash[_SEED]


def _replay_hint(config: pytest.Config) -> str:
    seed = config.stash[_SEED]
    return f"hypothesis seed: {seed} (replay: --hypothesis-seed={seed}, or make fuzz SEED={seed})"


def pytest_report_header(config: pytest.Config) -> str:
    return _replay_hint(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        report.sections.append(("hypothesis seed", _replay_hint(item.config)))
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_sep("=", _replay_hint(config))


@pytest.fixture(autouse=True)
def sdk_oracle() -> Iterator[list[bytes]]:
    """Teardown check: everything this test made the server emit parses with the SDK and
    satisfies the Open Responses required fields."""
    start, body_start = len(RECORDED), len(BODIES)
    yield RECORDED
    from openai.types.responses import Response

    for raw in RECORDED[start:]:
        parsed = sdk_parse(raw)
        if isinstance(parsed, dict):  # response.done: validate the snapshot it carries
            Response.model_validate(parsed["response"])
    faults = open_responses_faults(RECORDED[start:], BODIES[body_start:])
    del RECORDED[start:]
    del BODIES[body_start:]
    assert not faults, f"{len(faults)} Open Responses faults, first: {faults[:5]}"
