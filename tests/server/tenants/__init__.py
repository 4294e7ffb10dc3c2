"""Tenants never see each other: ownership, isolation, closed by default, billing."""
