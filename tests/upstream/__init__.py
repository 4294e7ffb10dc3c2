"""Upstream backends (chat completions, Responses) against local peers (SPEC: UP-*)."""
