"""``rollout bench``'s modes beyond the transport comparison: load, chaos, soak,
memory, streaming, stores, upstream kinds, resume, the codex scenario, peers."""
