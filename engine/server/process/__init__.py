"""The process: `rollout serve`'s flags, serving, workers."""
