"""What a process retains between requests: an HTTP chain's parked rollout (PARK-4)."""
