"""The Postgres store."""
