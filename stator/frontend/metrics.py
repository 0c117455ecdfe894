"""Prometheus metrics of the frontend (`stator_frontend_*`), one registry per app so that
several apps (tests, `stator run`) never collide. Listed in docs/metrics.md."""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
_STAGE_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0,
)  # fmt: skip
_TOKEN_BUCKETS = tuple(float(2**i) for i in range(0, 18))

STAGES = ("template", "tokenize", "route", "detokenize")


class TokenHistogram(Collector):
    """A labelled histogram for per-token observations, read by Prometheus like any other.

    `prometheus_client.Histogram.observe` takes a lock and walks its buckets in Python,
    about 1 µs; at one observation per streamed token that was the frontend's largest
    own per-token cost. Here an observation is a C `bisect` and two additions. Not
    thread-safe: it is only fed from the event loop's thread.
    """

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple[float, ...]):
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = list(buckets)
        self.series: dict[str, TokenHistogram.Series] = {}

    class Series:
        __slots__ = ("counts", "sum")

        def __init__(self, size: int) -> None:
            self.counts = [0] * size
            self.sum = 0.0

    def labels(self, value: str) -> TokenHistogram.Series:
        series = self.series.get(value)
        if series is None:
            series = self.series[value] = TokenHistogram.Series(len(self.bounds) + 1)
        return series

    def observe(self, series: TokenHistogram.Series, value: float) -> None:
        series.counts[bisect.bisect_left(self.bounds, value)] += 1
        series.sum += value

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
        self.requests = Counter(
            p + "requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
            registry=r,
        )  # fmt: skip
        self.inflight = Gauge(
            p + "inflight_requests", "Generation requests being served", ["model"], registry=r
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds", "Arrival to first output token",
            ["model"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = TokenHistogram(
            p + "inter_token_latency_seconds", "Gap between consecutive streamed outputs",
            "model", _ITL_BUCKETS,
        )  # fmt: skip
        r.register(self.itl)
        self.duration = Histogram(
            p + "request_duration_seconds", "Arrival to last byte of a generation request",
            ["model"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.input_tokens = Histogram(
            p + "input_tokens", "Prompt tokens per request", ["model"],
            buckets=_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.output_tokens = Histogram(
            p + "output_tokens", "Generated tokens per request (all choices)", ["model"],
            buckets=_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.cached_tokens = Counter(
            p + "cached_tokens", "Prompt tokens served from workers' prefix caches",
            ["model"], registry=r,
        )  # fmt: skip
        self.stage = Histogram(
            p + "stage_seconds", "Time spent per pipeline stage (template, tokenize, route, "
            "detokenize)", ["stage"], buckets=_STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.disconnects = Counter(
            p + "client_disconnects", "Requests whose client went away before the end",
            ["model"], registry=r,
        )  # fmt: skip
        self.models = Gauge(p + "models", "Models currently served", registry=r)
        # Children resolved once: a labelled lookup per token would cost more than the
        # observation itself.
        self.stage_timers = {s: self.stage.labels(s) for s in STAGES}

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GenerationTracker:
    """Timing and token accounting of one generation request, fed as it streams."""

    __slots__ = (
        "_first", "_itl", "_itl_series", "_last", "_metrics", "_model", "_start", "prompt_tokens",
    )  # fmt: skip

    def __init__(self, metrics: FrontendMetrics, model: str, prompt_tokens: int) -> None:
        self._metrics = metrics
        self._model = model
        self.prompt_tokens = prompt_tokens
        self._start = time.perf_counter()
        self._first: float | None = None
        self._last = 0.0
        self._itl = metrics.itl
        self._itl_series = metrics.itl.labels(model)  # resolved once, observed per output
        metrics.inflight.labels(model).inc()

    def output(self) -> None:
        """An output (one or more tokens of text) went to the client."""
        now = time.perf_counter()
        if self._first is None:
            self._first = now
            self._metrics.ttft.labels(self._model).observe(now - self._start)
        else:
            self._itl.observe(self._itl_series, now - self._last)
        self._last = now

    def finish(self, completion_tokens: int, cached_tokens: int, *, disconnected: bool) -> None:
        m, model = self._metrics, self._model
        m.inflight.labels(model).dec()
        m.duration.labels(model).observe(time.perf_counter() - self._start)
        m.input_tokens.labels(model).observe(self.prompt_tokens)
        m.output_tokens.labels(model).observe(completion_tokens)
        if cached_tokens:
            m.cached_tokens.labels(model).inc(cached_tokens)
        if disconnected:
            m.disconnects.labels(model).inc()
