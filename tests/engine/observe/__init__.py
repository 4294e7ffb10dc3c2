"""Observability: the stage histograms and counters, the ledger, bench timings (OBS-*)."""
