"""The decode agent's three batched exchanges with one prefill worker (`batching.Batcher`):

- `copy_batcher`: the pulls from one prefill pool by a `PeerCopier`, one launch over the
  union of their block ids; two batches in flight (one copying, the next enqueued);
- `check_batcher`: the pin checks on one prefill server, one `acquire` round trip for
  every pin pending (the server answers each pin's problem, or None);
- `release_batcher`: the releases, one `release` round trip for every pin pending.

A pull's own block ids never overlap another's in flight: each pull writes blocks the
decode engine allocated to its request alone, so the union is a plain concatenation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from stator.kv.transfer.batching import Batcher
from stator.kv.transfer.result import TransferError

if TYPE_CHECKING:
    from stator.kv.transfer.peer_copier import PeerCopier

Ids = tuple[list[int], list[int]]  # (remote, local) block ids of one pull
Request = Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict]]
COPY_DEPTH = 2  # batches in flight: one copying, the next staged behind it on the stream
RELEASE_TIMEOUT_S = 5.0  # best effort: the prefill side's pin timeout is the backstop


class LaunchFailed(Exception):
    """The copier could not enqueue a batch (the agent copies by `copy_blocks` instead)."""


def copy_batcher(copier: PeerCopier, enabled: bool) -> Batcher[Ids, dict[str, float]]:
    """Each pull's result: the phases of its batch's copy (`launch` host seconds,
    `device` seconds from the ids' upload to the copy's end, `wait` until the event
    loop heard of it)."""

    def start(pulls: list[Ids]):
        began = time.perf_counter()
        remote = [b for r, _ in pulls for b in r]
        local = [b for _, lo in pulls for b in lo]
        try:
            begin, done = copier.launch(remote, local)
        except Exception as exc:
            raise LaunchFailed(f"{type(exc).__name__}: {exc}") from exc
        launched = time.perf_counter()
        return len(pulls), begin, done, launched - began, launched

    async def finish(started) -> list[dict[str, float]]:
        count, begin, done, launch, launched = started
        await asyncio.to_thread(done.synchronize)
        phases = {
            "launch": launch,
            "wait": time.perf_counter() - launched,
            "device": begin.elapsed_time(done) / 1e3,
        }
        return [phases] * count

    return Batcher(start, finish, depth=COPY_DEPTH, enabled=enabled)


def check_batcher(request: Request, timeout: float, enabled: bool) -> Batcher:
    """Items: (transfer, pin, blocks) of one prefill server. One pin alone keeps the
    plain `acquire` message; several go as `pins`, answered pin by pin."""

    def message(checks: list[tuple[dict[str, Any], str, list[int]]]) -> dict[str, Any]:
        if len(checks) == 1:
            return {"op": "acquire", "pin": checks[0][1], "blocks": checks[0][2]}
        return {"op": "acquire", "pins": [[pin, blocks] for _, pin, blocks in checks]}

    def answers(answer: dict, count: int) -> list[Any]:
        if count == 1:
            return [answer]
        problems = answer.get("problems") or []
        if len(problems) != count:
            raise TransferError(f"{len(problems)} pin answers for {count} pins")
        return [{"ok": True} if p is None else TransferError(str(p)) for p in problems]

    return _round_trip_batcher(request, timeout, message, answers, enabled)


def release_batcher(request: Request, enabled: bool) -> Batcher:
    """Items: (transfer, pin) of one prefill server."""

    def message(releases: list[tuple[dict[str, Any], str]]) -> dict[str, Any]:
        if len(releases) == 1:
            return {"op": "release", "pin": releases[0][1]}
        return {"op": "release", "pins": [pin for _, pin in releases]}

    def answers(answer: dict, count: int) -> list[Any]:
        return [answer] * count

    return _round_trip_batcher(request, RELEASE_TIMEOUT_S, message, answers, enabled)


def _round_trip_batcher(
    request: Request,
    timeout: float,
    message: Callable[[list], dict[str, Any]],
    answers: Callable[[dict, int], list[Any]],
    enabled: bool,
) -> Batcher:
    """Items whose first element is the prefill server's transfer parameters: one
    `message` for the batch, one round trip (given up after `timeout`), then `answers`
    splits the server's answer into one result per item."""

    def start(items: list) -> tuple[int, asyncio.Future]:
        exchange = asyncio.wait_for(request(items[0][0], message(items)), timeout)
        return len(items), asyncio.ensure_future(exchange)

    async def finish(started: tuple[int, asyncio.Future]) -> list[Any]:
        count, exchange = started
        return answers(await exchange, count)

    return Batcher(start, finish, depth=1, enabled=enabled)
