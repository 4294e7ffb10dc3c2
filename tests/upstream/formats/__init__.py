"""Model formats: registries, tool and reasoning parsers, harmony, sealed reasoning, and
how each upstream sees hosted MCP tools."""
