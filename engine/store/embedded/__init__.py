"""The embedded SQLite store: its records, thread, WAL reader, inline fast path,
checkpoints."""
