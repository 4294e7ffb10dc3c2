"""The tools test requests offer."""

from __future__ import annotations

from typing import Any

# The one function tool most tests offer: strict, one required string parameter.
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}

# The same tool, not strict and with nothing required (the simulator may call it with {}).
WEATHER_LOOSE: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}

# A non-strict tool the simulator calls for ``read_file <path>`` inputs.
READ_FILE: dict[str, Any] = {
    "type": "function",
    "name": "read_file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
