"""OBS-3: post-inference counts its metrics in plain numbers (``Pending``) and folds them into
the Prometheus families when they are read. What a reader sees is what observing each value
with ``prometheus_client`` itself would have given: the same exposition, bucket by bucket."""

from __future__ import annotations

import collections
import math
import random

from prometheus_client import CollectorRegistry, generate_latest

from engine.observe.metrics import _BUCKETS, Metrics


def _exposition(registry: CollectorRegistry, prefixes: tuple[str, ...]) -> dict[str, float]:
    """The families' samples, without the ``_created`` timestamps (when a child was made)."""
    lines = generate_latest(registry).decode().splitlines()
    samples = (line.rsplit(" ", 1) for line in lines if line.startswith(prefixes))
    return {name: float(value) for name, value in samples if "_created" not in name}


def test_folded_metrics_read_as_if_each_value_were_observed() -> None:
    values = [*_BUCKETS, 0.0, 1e-9, 99.0, *(b * 1.0001 for b in _BUCKETS)]  # each edge, both sides
    rng = random.Random(7)
    values += [rng.lognormvariate(-7, 3) for _ in range(500)]
    metrics = Metrics(collections.Counter())
    direct = Metrics(collections.Counter())  # the same families, observed one value at a time
    folded_tokens = metrics.tokens.labels("input")
    for n, seconds in enumerate(values):
        stage = ("scan", "model", "post")[n % 3]
        metrics.pending.observe(stage, seconds)
        direct.stage_histogram.labels(stage).observe(seconds)
        metrics.pending.inc(folded_tokens, n)
        direct.tokens.labels("input").inc(n)
        if n == 300:  # a read part-way: what follows adds to what was folded
            metrics.render()
    ours = metrics.render()
    assert b'rollout_stage_seconds_count{stage="scan"}' in ours
    prefixes = ("rollout_stage_seconds", "rollout_tokens_total")
    folded = _exposition(metrics.registry, prefixes)
    observed = _exposition(direct.registry, prefixes)
    assert folded.keys() == observed.keys()
    for name, value in observed.items():
        if "_sum" in name:  # added in another order: equal to the last few bits
            assert math.isclose(folded[name], value, rel_tol=1e-12), name
        else:  # every bucket and count exactly
            assert folded[name] == value, name


def test_the_inspector_read_folds_first() -> None:
    """The inspector reads the histogram itself (``collect``): what was counted is in it."""
    metrics = Metrics(collections.Counter())
    metrics.pending.observe("post", 0.002)
    samples = {
        (s.name, s.labels.get("stage")): s.value
        for family in metrics.pending.collect()
        for s in family.samples
    }
    assert samples[("rollout_stage_seconds_count", "post")] == 1.0
    assert samples[("rollout_stage_seconds_sum", "post")] == 0.002
