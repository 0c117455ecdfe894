"""Benchmark-only time stamps along a request's path to its first token, for
`frontend_ttft_trace.py`.

`python benchmarks/ttft_probes.py frontend|worker|engine|requests TRACE_FILE -- <stator args>` runs
`stator <args>` after wrapping a few functions of the frontend (uvicorn's HTTP protocol,
body decode, template, tokenizer, sampling mapping, request-plane client, detokenizer,
the ASGI send) or of the worker (request-plane server, WorkerHost, the mocker) so that
each call appends (stage, CLOCK_MONOTONIC ns) to a list; the list is written to
TRACE_FILE as JSON when the process exits. Role `engine` stamps only the mocker's
`generate`: per request, when it was called and when its first output came (the
engine's own TTFT, as the worker sees it, at any concurrency). Role `requests` stamps the
frontend per request (see `install_frontend_requests`), at any concurrency. Nothing in stator changes: the wrappers exist
only in the traced process, and the clock is the same in every process on the box, so
the stamps of the frontend, the worker and the client line up.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EVENTS: list[tuple[str, int]] = []
_now = time.monotonic_ns


def mark(stage: str) -> None:
    EVENTS.append((stage, _now()))


def around(cls: type, attr: str, before: str | None = None, after: str | None = None) -> None:
    """Stamp `before` on entry to `cls.attr` (a plain method) and `after` on return."""
    inner = getattr(cls, attr)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before:
            mark(before)
        try:
            return inner(*args, **kwargs)
        finally:
            if after:
                mark(after)

    setattr(cls, attr, wrapper)


def around_async(owner: Any, attr: str, before: str, after: str) -> None:
    inner = getattr(owner, attr)

    @functools.wraps(inner)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(before)
        try:
            return await inner(*args, **kwargs)
        finally:
            mark(after)

    setattr(owner, attr, wrapper)


def around_agen(cls: type, attr: str, entered: str, item: str) -> None:
    """Stamp `entered` when an async generator method starts, `item` at each item."""
    inner = getattr(cls, attr)

    @functools.wraps(inner)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        mark(entered)
        gen = inner(*args, **kwargs)
        try:
            async for value in gen:
                mark(item)
                yield value
        finally:
            await gen.aclose()

    setattr(cls, attr, wrapper)


def install_frontend() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    import stator.frontend.http.app as app_module
    from stator.frontend.processor.stator import StatorProcessor
    from stator.frontend.routing import ChoiceStream
    from stator.llm.chat_template import ChatTemplate
    from stator.llm.postprocess import ChoiceProcessor
    from stator.llm.tokenizer import Tokenizer
    from stator.runtime.request_plane.tcp import _ClientConnection

    around(HttpToolsProtocol, "data_received", before="http_bytes_in")
    around(HttpToolsProtocol, "on_message_complete", after="http_parsed")
    around_async(app_module, "_parse", "route_entered", "body_decoded")
    around(ChatTemplate, "render", before="template_start", after="template_done")
    around(Tokenizer, "encode", after="tokenized")
    around(StatorProcessor, "plan_choices", after="engine_request_built")
    around(_ClientConnection, "open", before="plane_send", after="plane_written")
    around(_ClientConnection, "data_received", before="plane_bytes_in")
    around(ChoiceProcessor, "process", before="detokenize_start", after="detokenized")
    around_async(ChoiceStream, "prime", "prime_start", "primed")

    send = RequestResponseCycle.send

    async def traced_send(self: Any, message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            mark("headers_send")
        elif message.get("body"):
            mark("body_send")
        await send(self, message)
        if kind != "http.response.start" and message.get("body"):
            mark("body_written")

    RequestResponseCycle.send = traced_send  # type: ignore[method-assign]


def install_worker() -> None:
    from stator.engines.mocker.engine import MockerEngine
    from stator.runtime.request_plane.tcp import _ServerConnection
    from stator.worker.host import WorkerHost

    around(_ServerConnection, "data_received", before="worker_bytes_in")
    around(_ServerConnection, "_start", before="worker_frame", after="worker_task_made")
    around_agen(WorkerHost, "_generate", "host_generate", "host_item")
    around_agen(MockerEngine, "generate", "engine_generate", "engine_item")
    around(MockerEngine, "_emit", before="engine_step_done")
    around(_ServerConnection, "flush", after="worker_flushed")


def install_engine() -> None:
    """Per request: ("engine_ttft", called ns, first output ns); nothing per token."""
    from stator.engines.mocker.engine import MockerEngine

    inner = MockerEngine.generate

    @functools.wraps(inner)
    async def generate(*args: Any, **kwargs: Any) -> Any:
        called = _now()
        first = True
        gen = inner(*args, **kwargs)
        try:
            async for value in gen:
                if first:
                    first = False
                    EVENTS.append(("engine_ttft", called, _now()))  # type: ignore[arg-type]
                yield value
        finally:
            await gen.aclose()

    MockerEngine.generate = generate  # type: ignore[method-assign]


REQUESTS: dict[int, dict[str, int]] = {}  # per request task: stage -> ns


def install_frontend_requests() -> None:
    """Per request, at any concurrency (keyed by its uvicorn task): when uvicorn made its
    cycle (headers parsed), when the task first ran, the route entered, the prompt
    tokenized, the request-plane send, the first engine output primed, and the first
    body write. Nothing per token."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    import stator.frontend.http.app as app_module
    from stator.frontend.routing import ChoiceStream
    from stator.llm.tokenizer import Tokenizer
    from stator.runtime.request_plane.tcp import _ClientConnection

    def stamp(stage: str) -> None:
        task = asyncio.current_task()
        entry = REQUESTS.get(id(task)) if task is not None else None
        if entry is not None and stage not in entry:
            entry[stage] = _now()

    init = RequestResponseCycle.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._probe_created = _now()

    run_asgi = RequestResponseCycle.run_asgi

    async def traced_run_asgi(self: Any, app: Any) -> None:
        task = asyncio.current_task()
        REQUESTS[id(task)] = {"created": self._probe_created, "task_ran": _now()}
        try:
            await run_asgi(self, app)
        finally:
            done = REQUESTS.pop(id(task))
            if "first_write" in done:
                FINISHED.append(done)

    send = RequestResponseCycle.send

    async def traced_send(self: Any, message: dict) -> None:
        await send(self, message)
        if message["type"] == "http.response.body" and message.get("body"):
            stamp("first_write")

    def after(owner: Any, attr: str, stage: str, is_async: bool = False) -> None:
        inner = getattr(owner, attr)
        if is_async:

            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                stamp(stage + "_start")
                result = await inner(*args, **kwargs)
                stamp(stage)
                return result
        else:

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                result = inner(*args, **kwargs)
                stamp(stage)
                return result

        setattr(owner, attr, functools.wraps(inner)(wrapper))

    RequestResponseCycle.__init__ = __init__  # type: ignore[method-assign]
    RequestResponseCycle.run_asgi = traced_run_asgi  # type: ignore[method-assign]
    RequestResponseCycle.send = traced_send  # type: ignore[method-assign]
    after(app_module, "_parse", "body_decoded", is_async=True)  # stamps route too
    after(Tokenizer, "encode", "tokenized")
    after(_ClientConnection, "open", "plane_sent")
    after(ChoiceStream, "prime", "primed", is_async=True)


FINISHED: list[dict[str, int]] = []


def main() -> int:
    role, trace_file, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: ttft_probes.py ROLE TRACE_FILE -- <stator args>"
    roles = {
        "frontend": install_frontend,
        "worker": install_worker,
        "engine": install_engine,
        "requests": install_frontend_requests,
    }
    roles[role]()
    out = FINISHED if role == "requests" else EVENTS
    atexit.register(lambda: Path(trace_file).write_text(json.dumps(out)))
    from stator.cli.main import main as stator_main

    return stator_main(argv)


if __name__ == "__main__":
    sys.exit(main())
