"""The Agents SDK's shared test agent (TEST-1): one weather agent whose tool records its calls."""

from __future__ import annotations

from typing import Any

import agents
from agents import Agent, function_tool

agents.set_tracing_disabled(True)  # no exporter may try the network

MODEL = "gpt-x"


def weather_agent(calls: list[str], *, model: Any = MODEL) -> Agent[Any]:
    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: The city name.
        """
        calls.append(city)
        return f"sunny in {city}"

    return Agent(
        name="weather",
        instructions="Answer weather questions with the tool.",
        tools=[get_weather],
        model=model,
    )
