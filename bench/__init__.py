"""In-process micro benchmarks of engine parts (run from a checkout: ``python -m bench.NAME``).

Not a test and not shipped: the floors let ``bench`` import ``engine`` and ``protocol`` and
nothing imports ``bench`` (ARCH-1). The over-the-wire benchmark is ``clients/bench``."""
