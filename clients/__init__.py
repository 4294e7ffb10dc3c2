"""Python clients for the rollout engine, built on ``protocol`` only (never on ``engine``)."""
