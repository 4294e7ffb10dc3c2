"""The rollout coroutine's life: append mode, the compat fast path, suspension and its
deadlines, its states (ROLL-*, APPEND-*, COMPAT-2, LIM-6, LIM-7)."""
