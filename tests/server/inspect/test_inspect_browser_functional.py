"""The inspector page in a real browser: Debian's chromium, driven headless by playwright
(INSP-1..INSP-4). Playwright's own browser download is never used: the test launches the system
chromium, which `make sysdeps` installs, and fails (never skips) when it is missing.

It opens ``/inspect`` with an API key, sees a rollout suspended on a tool call and its pending
call, resumes that rollout through the openai SDK and sees the page follow without a reload.
Screenshots are written to ``artifacts/`` (ignored by git) for a person to look at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from playwright.async_api import Page, async_playwright, expect

from engine.server.transport.server_config import ServerConfig
from tests.support.tools import WEATHER

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"
KEY = "sk-browser-test"


async def first_completed(conn: Any) -> Any:
    async for event in conn:
        if event.type == "response.completed":
            return event.response
        assert event.type != "error", event


@pytest.fixture
def chromium() -> Path:
    """Debian's chromium; missing is a failure, never a skip."""
    assert CHROMIUM.is_file(), "chromium is missing: `make sysdeps` installs Debian's package"
    ARTIFACTS.mkdir(exist_ok=True)
    return CHROMIUM


async def test_inspector_follows_a_suspended_rollout(server_factory: Any, chromium: Path) -> None:
    live = await server_factory(server=ServerConfig(api_keys=frozenset({KEY})))
    client = AsyncOpenAI(base_url=live.base_url, api_key=KEY)
    async with (
        client.responses.connect() as conn,
        client.responses.connect() as other,
        async_playwright() as driver,
    ):
        await conn.response.create(
            model="gpt-x", input="Weather in Paris?", tools=[WEATHER], store=False
        )
        first = await first_completed(conn)
        call = first.output[0]
        # A second connection: another suspended rollout, and a request error for the ring.
        await other.response.create(
            model="sim", input="What is the weather in Oslo today?", tools=[WEATHER]
        )
        await first_completed(other)
        await other.response.create(model="sim", input="hi", previous_response_id="resp_gone")
        assert (await other.recv()).type == "error"

        browser = await driver.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1500, "height": 1000})
        await page.goto(f"http://127.0.0.1:{live.port}/inspect")
        await page.fill("#key", KEY)  # the login form: the key travels in a POST body (AUTH-13)
        await page.click("button[type=submit]")
        await page.wait_for_url(f"http://127.0.0.1:{live.port}/inspect")
        assert KEY not in page.url  # never in an address (INSP-2)
        await expect(page.locator("#live")).to_have_text("● live")

        row = page.locator("#rollouts tr[data-rollout-id]").filter(
            has=page.locator(f'[data-call-id="{call.call_id}"]')
        )
        await expect(row).to_have_count(1)
        await expect(row.locator(".pending")).to_have_text(f"get_weather · {call.call_id}")
        await expect(row).to_contain_text("suspended")
        await expect(row.locator(f'[title="{first.id}"]')).to_have_count(1)
        rollout_id = await row.get_attribute("data-rollout-id")
        assert rollout_id is not None and rollout_id.startswith("rollout_")
        await row.click()
        await expect(page.locator("#turns tbody tr")).to_have_count(1)
        await expect(page.locator("#turns tbody")).to_contain_text(first.id)
        await expect(page.locator("#errors tbody")).to_contain_text("previous_response_not_found")
        await page.screenshot(path=str(ARTIFACTS / "inspect-suspended.png"), full_page=True)

        await page.evaluate("window.notReloaded = true")
        await conn.response.create(
            model="gpt-x",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=[WEATHER],
            store=False,
        )
        second = await first_completed(conn)
        assert second.output_text == "Based on the tool results: sunny"
        await expect_resumed(page, rollout_id, call.call_id, second.id)
        assert await page.evaluate("window.notReloaded") is True  # updated live, no reload
        await page.screenshot(path=str(ARTIFACTS / "inspect-resumed.png"), full_page=True)
        await browser.close()
    await client.close()


async def expect_resumed(page: Page, rollout_id: str, call_id: str, response_id: str) -> None:
    """The pending call is gone, the rollout is listed as ended, and its open turn history
    grew to two turns, the second one in the continuation's response."""
    await expect(page.locator(f'#rollouts [data-call-id="{call_id}"]')).to_have_count(0)
    ended = page.locator(f'#ended tr[data-rollout-id="{rollout_id}"]')
    await expect(ended).to_contain_text("completed")
    await expect(ended.locator(f'[title="{response_id}"]')).to_have_count(1)
    await expect(page.locator("#turns tbody tr")).to_have_count(2)
    await expect(page.locator("#turns tbody tr").nth(1)).to_contain_text(response_id)
