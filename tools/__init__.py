"""Developer tools outside the shipped packages: ``make mutants`` (mutants.py, mutants.toml)."""
