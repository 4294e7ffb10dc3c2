"""The embedded SQLite store: faults, its inline path, fsync, its queue."""
