"""Training fields on items and NeMo Gym against a ``tokens`` route (TOK-60..TOK-65)."""
