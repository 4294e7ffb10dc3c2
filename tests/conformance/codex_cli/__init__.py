"""The Codex CLI as a client."""
