"""Prometheus metrics of the ops (optional: ``prometheus_client`` is never a dependency).

``register(op)`` exposes ``op.stats()`` under the prefix ``gemmar_aot_``, read when the registry
is scraped, so serving a call costs nothing more than the one increment ``stats`` already
counts::

    gemmar_aot_calls_total{transport, rank, m}      served calls at each padded M
    gemmar_aot_launches_total{transport, rank, m}   kernel launches they made
    gemmar_aot_misses_total{transport, rank, m}     calls at an M the artifacts lack
    gemmar_aot_padded_rows_total{transport, rank}   rows computed beyond the rows asked for
    gemmar_aot_startup_seconds{transport, rank}     construction up to ready
    gemmar_aot_call_m{transport, rank}              a histogram of the served calls' M (one bucket per M)

Runtime module: standard library; ``prometheus_client`` imported by :func:`register` only.
"""

from __future__ import annotations

from typing import Any

PREFIX = "gemmar_aot"


class _Collector:
    def __init__(self, op: Any):
        self.op = op

    def describe(self):
        return []  # collected at scrape time only: nothing to check at registration

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self.op.stats()
        base = {"transport": s["transport"], "rank": str(s["rank"])}
        names = list(base)
        per_m = names + ["m"]
        for what, help_ in (("calls", "served calls at each padded M"), ("launches", "kernel launches they made"),
                            ("misses", "calls at an M the artifacts lack")):
            fam = CounterMetricFamily(f"{PREFIX}_{what}", help_, labels=per_m)
            for m, n in s[what].items():
                fam.add_metric([*base.values(), "none" if m is None else str(m)], n)
            yield fam
        fam = CounterMetricFamily(f"{PREFIX}_padded_rows", "rows computed beyond the rows asked for", labels=names)
        fam.add_metric(list(base.values()), s["padded_rows"])
        yield fam
        if s["startup_seconds"] is not None:
            fam = GaugeMetricFamily(f"{PREFIX}_startup_seconds", "construction up to ready", labels=names)
            fam.add_metric(list(base.values()), s["startup_seconds"])
            yield fam
        buckets, total = [], 0
        for m, n in sorted(s["calls"].items()):
            total += n
            buckets.append((str(float(m)), total))
        buckets.append(("+Inf", total))
        fam = HistogramMetricFamily(f"{PREFIX}_call_m", "the served calls' M", labels=names)
        fam.add_metric(list(base.values()), buckets, sum_value=sum(m * n for m, n in s["calls"].items()))
        yield fam


def register(op: Any, registry: Any = None) -> _Collector:
    """Expose ``op.stats()`` as Prometheus metrics in ``registry`` (default: prometheus_client's
    global one). Raises ImportError naming the package when prometheus_client is not installed."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        raise ImportError("gemmar_aot.runtime.metrics needs prometheus_client: pip install prometheus-client "
                          "(op.stats() works without it)") from None
    collector = _Collector(op)
    (registry if registry is not None else REGISTRY).register(collector)
    return collector
