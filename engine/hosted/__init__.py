"""Hosted tools: the remote MCP servers a rollout calls for its model (SPEC §18).

Below ``rollout``: it owns the MCP sessions of one rollout (one per server, reused, closed with
the rollout), lists and calls tools, and knows nothing of models or of the wire."""
