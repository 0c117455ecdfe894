"""What the planner observes, from the frontends' metrics (scraped directly, or queried
from Prometheus) and the workers' load reports.

The parsing and the arithmetic (deltas between two scrapes, a quantile from histogram
buckets as Prometheus' `histogram_quantile` computes it) are pure functions; the readers
around them do the HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

TTFT = "stator_frontend_time_to_first_token_seconds"
ITL = "stator_frontend_inter_token_latency_seconds"
ISL = "stator_frontend_input_tokens"
OSL = "stator_frontend_output_tokens"
DECISIONS = "stator_global_router_decisions_total"
FRONTEND_UP = "stator_frontend_models"


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    count: float = 0.0
    sum: float = 0.0

    def minus(self, old: Histogram | None) -> Histogram:
        if old is None:
            return self
        if self.count < old.count:  # the frontend restarted: its counters did too
            return self
        return Histogram(
            {le: n - old.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.count - old.count,
            self.sum - old.sum,
        )

    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """As Prometheus' histogram_quantile: linear within the bucket that holds rank
        q·count; the +Inf bucket answers its lower bound."""
        if not self.count:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if math.isinf(le):
                    return lower
                if n == below:
                    return le
                return lower + (le - lower) * (rank - below) / (n - below)
            lower, below = le, n
        return lower


@dataclass
class Snapshot:
    """The histograms of one scrape (summed over the `model` label) and the global
    router's decisions per pool."""

    histograms: dict[str, Histogram] = field(default_factory=dict)
    pool_decisions: dict[str, float] = field(default_factory=dict)

    def minus(self, old: Snapshot) -> Snapshot:
        """What happened between `old` and this scrape of the same frontend."""
        return Snapshot(
            {name: h.minus(old.histograms.get(name)) for name, h in self.histograms.items()},
            {
                pool: n - old.pool_decisions.get(pool, 0.0)
                if n >= old.pool_decisions.get(pool, 0.0)
                else n
                for pool, n in self.pool_decisions.items()
            },
        )


def parse_metrics(text: str, model: str | None = None) -> Snapshot:
    snap = Snapshot()
    for family in text_string_to_metric_families(text):
        if family.name in (TTFT, ITL, ISL, OSL):
            hist = snap.histograms.setdefault(family.name, Histogram())
            for sample in family.samples:
                if model is not None and sample.labels.get("model") not in (None, model):
                    continue
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    hist.buckets[le] = hist.buckets.get(le, 0.0) + sample.value
                elif sample.name.endswith("_count"):
                    hist.count += sample.value
                elif sample.name.endswith("_sum"):
                    hist.sum += sample.value
        elif family.name == DECISIONS.removesuffix("_total"):
            for sample in family.samples:
                if sample.name == DECISIONS:
                    pool = sample.labels.get("pool", "")
                    snap.pool_decisions[pool] = snap.pool_decisions.get(pool, 0.0) + sample.value
    return snap


def merge(snapshots: Iterable[Snapshot]) -> Snapshot:
    """Several frontends' scrapes as one."""
    out = Snapshot()
    for snap in snapshots:
        for name, hist in snap.histograms.items():
            into = out.histograms.setdefault(name, Histogram())
            for le, n in hist.buckets.items():
                into.buckets[le] = into.buckets.get(le, 0.0) + n
            into.count += hist.count
            into.sum += hist.sum
        for pool, n in snap.pool_decisions.items():
            out.pool_decisions[pool] = out.pool_decisions.get(pool, 0.0) + n
    return out


@dataclass(frozen=True)
class Traffic:
    """One interval's traffic: requests that got their first token in it, mean ISL/OSL of
    the requests that finished in it, p90s."""

    requests: int
    isl: float
    osl: float
    ttft_p90_ms: float | None
    itl_p90_ms: float | None
    pool_requests: dict[str, float]
    isl_p90: float = 0.0


def traffic(new: Snapshot, old: Snapshot | None) -> Traffic:
    def delta(name: str) -> Histogram:
        hist = new.histograms.get(name, Histogram())
        return hist.minus(old.histograms.get(name) if old else None)

    ttft, itl, isl, osl = delta(TTFT), delta(ITL), delta(ISL), delta(OSL)
    p90_ttft, p90_itl = ttft.quantile(0.9), itl.quantile(0.9)
    pools = {
        pool: n - (old.pool_decisions.get(pool, 0.0) if old else 0.0)
        for pool, n in new.pool_decisions.items()
    }
    return Traffic(
        # Requests counted when their first token came, not when they finished: the ISL
        # histogram is observed at the end of a request, which lags its arrival by the
        # whole generation (11 s on average on the Mooncake mix in benchmarks/planner.py,
        # a minute for the longest outputs), and the planner would see a load step late.
        requests=round(ttft.count),
        isl=isl.mean() or 0.0,
        osl=osl.mean() or 0.0,
        ttft_p90_ms=None if p90_ttft is None else p90_ttft * 1000,
        itl_p90_ms=None if p90_itl is None else p90_itl * 1000,
        pool_requests=pools,
        isl_p90=isl.quantile(0.9) or 0.0,
    )


class ObservationUnavailable(Exception):
    """No metrics source answered: the planner cannot see its traffic this time."""


# What a metrics source that is down, restarting or unreachable raises; anything else is
# our own bug and is not swallowed.
_SOURCE_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, ValueError)


class FrontendScraper:
    """Scrapes `/metrics` of one or more frontends; `read()` -> the traffic since the
    previous read, or None while no frontend has a baseline yet (the first read, or the
    first after every frontend was unreachable). Raises `ObservationUnavailable` when no
    frontend answers.

    Each frontend keeps its own baseline. One that does not answer is left out and loses
    its baseline; when it answers again that scrape is its new baseline, so the requests it
    served while unreachable are never counted as one interval's burst (the interval it
    comes back in undercounts it instead, which the predictor's window smooths)."""

    def __init__(self, urls: list[str], model: str | None = None) -> None:
        self.urls = [u.rstrip("/") + "/metrics" if not u.endswith("/metrics") else u for u in urls]
        self.model = model
        self.last: dict[str, Snapshot] = {}
        self.down: dict[str, str] = {}  # url -> why its last scrape failed
        self._session: aiohttp.ClientSession | None = None

    async def _scrape(self, url: str) -> Snapshot:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        async with self._session.get(url) as resp:
            resp.raise_for_status()
            return parse_metrics(await resp.text(), self.model)

    async def read(self) -> Traffic | None:
        deltas: list[Snapshot] = []
        for url in self.urls:
            try:
                snap = await self._scrape(url)
            except _SOURCE_ERRORS as exc:
                self.down[url] = f"{type(exc).__name__}: {exc}"[:300]
                self.last.pop(url, None)
                continue
            self.down.pop(url, None)
            old = self.last.get(url)
            self.last[url] = snap
            if old is not None:
                deltas.append(snap.minus(old))
        if len(self.down) == len(self.urls):
            reasons = "; ".join(f"{u}: {why}" for u, why in self.down.items())
            raise ObservationUnavailable(f"no frontend answered: {reasons}")
        return traffic(merge(deltas), None) if deltas else None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class PrometheusReader:
    """The same traffic from a Prometheus server that scrapes the frontends
    (`--prometheus-url`): increase() over the interval and histogram_quantile()."""

    def __init__(self, url: str, model: str | None = None) -> None:
        self.url = url.rstrip("/") + "/api/v1/query"
        self.selector = f'{{model="{model}"}}' if model else ""
        self._session: aiohttp.ClientSession | None = None

    async def _query(self, promql: str) -> list[dict]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        async with self._session.get(self.url, params={"query": promql}) as resp:
            resp.raise_for_status()
            body = await resp.json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus query failed: {promql}: {body.get('error')}")
        return body["data"]["result"]

    async def _scalar(self, promql: str) -> float | None:
        result = await self._query(promql)
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value

    async def read(self, window: float) -> Traffic:
        """Raises `ObservationUnavailable` when Prometheus does not answer or fails a
        query."""
        try:
            return await self._read(window)
        except (*_SOURCE_ERRORS, RuntimeError, KeyError, IndexError) as exc:
            raise ObservationUnavailable(
                f"prometheus {self.url}: {type(exc).__name__}: {exc}"
            ) from exc

    async def _read(self, window: float) -> Traffic:
        w, s = f"{max(1, round(window))}s", self.selector
        # Every frontend exports this unlabelled gauge; when none is up (or none is
        # scraped) the increases below are empty and would read as no traffic at all.
        if not await self._scalar(f"count({FRONTEND_UP})"):
            raise ObservationUnavailable(
                f"prometheus {self.url} has no {FRONTEND_UP} series: no frontend is up or scraped"
            )

        def increase(name: str) -> str:
            return f"sum(increase({name}{s}[{w}]))"

        def p90(name: str) -> str:
            return f"histogram_quantile(0.9, sum by (le) (rate({name}_bucket{s}[{w}])))"

        count = await self._scalar(increase(TTFT + "_count")) or 0.0  # started, as traffic()
        isl_count = await self._scalar(increase(ISL + "_count")) or 0.0
        isl_sum = await self._scalar(increase(ISL + "_sum")) or 0.0
        osl_count = await self._scalar(increase(OSL + "_count")) or 0.0
        osl_sum = await self._scalar(increase(OSL + "_sum")) or 0.0
        ttft = await self._scalar(p90(TTFT))
        itl = await self._scalar(p90(ITL))
        isl_p90 = await self._scalar(p90(ISL))
        pools = {
            r["metric"].get("pool", ""): float(r["value"][1])
            for r in await self._query(f"sum by (pool) (increase({DECISIONS}[{w}]))")
        }
        return Traffic(
            requests=round(count),
            isl=isl_sum / isl_count if isl_count else 0.0,
            osl=osl_sum / osl_count if osl_count else 0.0,
            ttft_p90_ms=None if ttft is None else ttft * 1000,
            itl_p90_ms=None if itl is None else itl * 1000,
            pool_requests=pools,
            isl_p90=isl_p90 or 0.0,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
