"""The token-in ``tokens`` route end to end: trajectories, endings, markers, llama-server."""
