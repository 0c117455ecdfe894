"""Prometheus metrics of the frontend (`stator_frontend_*`), one registry per app so that
several apps (tests, `stator run`) never collide. Listed in docs/metrics.md.

Histograms are `FastHistogram`s: `prometheus_client.Histogram.observe` takes a lock and
walks its buckets in Python (about 1 µs), and a request observes about ten histograms plus
one per streamed token. Label children are resolved once per model (`ModelMetrics`), not
per observation.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from stator.frontend.http.security import TOKEN_CHARGE

# The planner reads p90 TTFT and ITL from these (`histogram_quantile`: linear within the
# bucket), so they are fine where latency targets live (TTFT 0.5-6 s, ITL 10-100 ms). In a
# wide bucket the tail is sparse and a linear read puts the p90 high: with 50-75 ms as one
# bucket a true 52 ms read as 60, and the planner, taking that as slow workers, ran 5% more
# worker-seconds on benchmarks/planner_sim.py (with 1,819 against 1,738).
_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03,
    0.035, 0.04, 0.045, 0.05, 0.055, 0.06, 0.07, 0.08, 0.09, 0.1, 0.125, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.5,
)  # fmt: skip
_STAGE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0,
)  # fmt: skip
_TOKEN_BUCKETS = tuple(float(2**i) for i in range(0, 18))

STAGES = ("template", "tokenize", "route", "detokenize")


class HistogramSeries:
    """One label value's buckets. An observation is a C `bisect` and two additions; not
    thread-safe: only the event loop's thread feeds it."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class FastHistogram(Collector):
    """A histogram with one label, exposed exactly like prometheus_client's."""

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple[float, ...]):
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = list(buckets)
        self.series: dict[str, HistogramSeries] = {}

    def labels(self, value: str) -> HistogramSeries:
        series = self.series.get(value)
        if series is None:
            series = self.series[value] = HistogramSeries(self.bounds)
        return series

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, series in list(self.series.items()):
            cumulative, buckets = 0, []
            for bound, count in zip([*self.bounds, float("inf")], series.counts, strict=True):
                cumulative += count
                buckets.append((_bound_text(bound), cumulative))
            family.add_metric([value], buckets, series.sum)
        yield family


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class FrontendMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        p = "stator_frontend_"

        def histogram(name: str, doc: str, label: str, buckets: tuple[float, ...]):
            metric = FastHistogram(p + name, doc, label, buckets)
            r.register(metric)
            return metric

        self.requests = Counter(
            p + "requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
            registry=r,
        )  # fmt: skip
        self.inflight = Gauge(
            p + "inflight_requests", "Generation requests being served", ["model"], registry=r
        )
        self.ttft = histogram(
            "time_to_first_token_seconds", "Arrival to first output token", "model",
            _LATENCY_BUCKETS,
        )  # fmt: skip
        self.itl = histogram(
            "inter_token_latency_seconds", "Gap between consecutive streamed outputs", "model",
            _ITL_BUCKETS,
        )  # fmt: skip
        self.duration = histogram(
            "request_duration_seconds", "Arrival to last byte of a generation request",
            "model", _LATENCY_BUCKETS,
        )  # fmt: skip
        self.input_tokens = histogram(
            "input_tokens", "Prompt tokens per request", "model", _TOKEN_BUCKETS
        )
        self.output_tokens = histogram(
            "output_tokens", "Generated tokens per request (all choices)", "model",
            _TOKEN_BUCKETS,
        )  # fmt: skip
        self.cached_tokens = Counter(
            p + "cached_tokens", "Prompt tokens served from workers' prefix caches",
            ["model"], registry=r,
        )  # fmt: skip
        self.stage = histogram(
            "stage_seconds",
            "Time spent per pipeline stage (template, tokenize, route, detokenize)",
            "stage",
            _STAGE_BUCKETS,
        )
        self.disconnects = Counter(
            p + "client_disconnects", "Requests whose client went away before the end",
            ["model"], registry=r,
        )  # fmt: skip
        self.models = Gauge(p + "models", "Models currently served", registry=r)
        self.stage_timers = {s: self.stage.labels(s) for s in STAGES}
        self._per_model: dict[str, ModelMetrics] = {}
        self._request_counters: dict[tuple[str, int], Counter] = {}

    def for_model(self, model: str) -> ModelMetrics:
        metrics = self._per_model.get(model)
        if metrics is None:
            metrics = self._per_model[model] = ModelMetrics(self, model)
        return metrics

    def count_request(self, endpoint: str, status: int) -> None:
        key = (endpoint, status)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self._request_counters[key] = self.requests.labels(endpoint, str(status))
        counter.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelMetrics:
    """The label children of one model, resolved once."""

    def __init__(self, metrics: FrontendMetrics, model: str) -> None:
        self.inflight = metrics.inflight.labels(model)
        self.ttft = metrics.ttft.labels(model)
        self.itl = metrics.itl.labels(model)
        self.duration = metrics.duration.labels(model)
        self.input_tokens = metrics.input_tokens.labels(model)
        self.output_tokens = metrics.output_tokens.labels(model)
        self.cached_tokens = metrics.cached_tokens.labels(model)
        self.disconnects = metrics.disconnects.labels(model)


class GenerationTracker:
    """Timing and token accounting of one generation request, fed as it streams."""

    __slots__ = ("_first", "_last", "_m", "_start", "prompt_tokens")

    def __init__(self, metrics: ModelMetrics, prompt_tokens: int) -> None:
        self._m = metrics
        self.prompt_tokens = prompt_tokens
        self._start = time.perf_counter()
        self._first: float | None = None
        self._last = 0.0
        metrics.inflight.inc()

    def output(self) -> None:
        """An output (one or more tokens of text) went to the client."""
        now = time.perf_counter()
        if self._first is None:
            self._first = now
            self._m.ttft.observe(now - self._start)
        else:
            self._m.itl.observe(now - self._last)
        self._last = now

    def finish(self, completion_tokens: int, cached_tokens: int, *, disconnected: bool) -> None:
        m = self._m
        m.inflight.dec()
        m.duration.observe(time.perf_counter() - self._start)
        m.input_tokens.observe(self.prompt_tokens)
        m.output_tokens.observe(completion_tokens)
        if cached_tokens:
            m.cached_tokens.inc(cached_tokens)
        if disconnected:
            m.disconnects.inc()
        charge = TOKEN_CHARGE.get()
        if charge is not None:  # --rate-limit-tpm: the tokens count against the key
            charge(self.prompt_tokens + completion_tokens)
