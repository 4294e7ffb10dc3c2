"""Model backends behind one streaming interface (SPEC: MODEL-1..MODEL-4)."""
