"""``rollout bench --load --load-two-keys`` (SPEC: RATE-9): one key floods the server while a
second key runs its agents; the second key's per-turn p99 is compared with its p99 alone.

The bench's own server gets a keys file: the flooding key limited to ``FLOOD_LIMIT`` requests a
minute, the calm key to far more than it uses (so both pay for the counting). Phase one: the calm
agents alone. Phase two: the same agents while ``flooders`` HTTP clients send creates with the
flooding key as fast as they are answered, never waiting out ``retry-after``. Every 429 is
checked: ``rate_limit_exceeded``, ``retry-after``, and the ``x-ratelimit-*`` headers with
nothing remaining. No assertions: figures, as every bench mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from clients.bench.proc import ServerProcess
from clients.bench.suites.load import LoadSettings, _percentile, drive

FLOOD_KEY, CALM_KEY = "sk-bench-flood", "sk-bench-calm"
FLOOD_LIMIT = 10  # requests per minute for the flooding key: it is over within a second
CALM_LIMIT = 1_000_000
REFUSED_WITHIN_S = 30.0


async def _flood(url: str, stop: asyncio.Event, seen: Counter[str], refused: asyncio.Event) -> None:
    headers = {"Authorization": f"Bearer {FLOOD_KEY}"}
    body = {"model": "sim", "input": "Flood.", "store": False}
    async with aiohttp.ClientSession(headers=headers) as session:
        while not stop.is_set():
            async with session.post(f"{url}/responses", json=body) as resp:
                payload = await resp.json()
                seen[str(resp.status)] += 1
                if resp.status == 429:
                    seen["bad_429"] += not _good_refusal(resp.headers, payload)
                    refused.set()


def _good_refusal(headers: Any, payload: dict[str, Any]) -> bool:
    """A 429 as RATE-5 says: the code, a retry-after, the figures with nothing remaining."""
    return (
        payload.get("error", {}).get("code") == "rate_limit_exceeded"
        and int(headers.get("retry-after", "0")) >= 1
        and headers.get("x-ratelimit-limit-requests") == str(FLOOD_LIMIT)
        and headers.get("x-ratelimit-remaining-requests") == "0"
        and bool(headers.get("x-ratelimit-reset-requests"))
    )


async def _calm(settings: LoadSettings, url: str) -> list[float]:
    headers = {"Authorization": f"Bearer {CALM_KEY}"}
    counts = await drive(settings, url, range(settings.connections), 0, headers)
    if counts.lost or counts.misordered:
        raise RuntimeError(f"calm agents: {counts.lost} lost, {counts.misordered} misordered")
    return counts.overhead_ms


async def run_two_keys(settings: LoadSettings, flooders: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        keys = Path(folder) / "keys"
        keys.write_text(
            f"{FLOOD_KEY} requests={FLOOD_LIMIT}\n{CALM_KEY} requests={CALM_LIMIT}\n", "utf-8"
        )
        async with ServerProcess(tokens_per_second=0, keys_file=keys) as server:
            calm = replace(settings, http_clients=0)
            await _calm(replace(calm, connections=2, turns=2), server.url)  # warm up
            alone = await _calm(calm, server.url)
            stop, refused, seen = asyncio.Event(), asyncio.Event(), Counter[str]()
            flood = [
                asyncio.create_task(_flood(server.url, stop, seen, refused))
                for _ in range(flooders)
            ]
            try:
                loaded = await _calm(calm, server.url)
                # a short run may end before the flood passed its limit: it goes on until then
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(refused.wait(), REFUSED_WITHIN_S)
            finally:
                stop.set()
                await asyncio.gather(*flood)
    p99_alone, p99_loaded = _percentile(alone, 0.99), _percentile(loaded, 0.99)
    return {
        "calm": {"connections": settings.connections, "turns": settings.turns},
        "flooders": flooders,
        "calm_p50_ms_alone": _percentile(alone, 0.5),
        "calm_p50_ms_flooded": _percentile(loaded, 0.5),
        "calm_p99_ms_alone": p99_alone,
        "calm_p99_ms_flooded": p99_loaded,
        "p99_ratio": round(p99_loaded / p99_alone, 2) if p99_alone and p99_loaded else None,
        "flood_answers": dict(seen),
        "lost": 0,  # a calm agent that lost or misordered an event raised instead
        "misordered": 0,
    }
