"""Bounds that hold in real bytes and counts: memory, queues, ranges, rate limits."""
