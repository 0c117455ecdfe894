"""An engine core in its own process: `python -m stator.engines.native.core_process ARGS`.

`CoreProcessEngine` (the worker host's side) starts it with ARGS as JSON: the engine
config, the model directory, the worker id and two ZMQ addresses. The process builds the
`EngineCore` (and, with tensor parallelism, starts its ranks as its own children), says
`CoreReady`, then runs a tight loop: take every waiting input frame, run one step, send
one `StepOutputs` frame. No asyncio, no HTTP, no per-request messages: the loop's Python
is the scheduler's and the step's, and the GPU is kept fed (with overlap, a step's frame
is encoded and sent while the next step runs on the device).

A step that raises ends the process after a `CoreFailed` frame; the host fails the
requests in flight and reports itself unhealthy. The process exits as soon as its stdin
closes (the host's end of that pipe), so it never outlives the worker, however the
worker went.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
import threading
import time
from typing import Any

import torch
import zmq

from stator.engines.base import EngineError, Unsupported
from stator.engines.native.config import NativeConfig
from stator.engines.native.core_messages import (
    ENCODER,
    INPUT_DECODER,
    AbortRequest,
    AddRequest,
    Call,
    CallResult,
    CoreFailed,
    CoreInput,
    CoreReady,
    Shutdown,
    StepOutputs,
)
from stator.engines.native.core_metrics import core_metrics
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.lora.adapter import load_adapter, pin_adapter
from stator.engines.native.lora.resolve import resolve_adapter
from stator.engines.native.native_card import CoreInfo
from stator.engines.native.rank_worker import exit_when_parent_is_gone
from stator.logs import setup_logging
from stator.protocols import INVALID_REQUEST, EngineOutput

log = logging.getLogger("stator.engines.native.core_process")

# How often the core's gauges ride along on a step frame.
_METRICS_INTERVAL_S = 1.0


class CoreServer:
    """The loop around one `EngineCore`: inputs in, one step, one frame out."""

    def __init__(self, core: EngineCore, config: NativeConfig, inputs, outputs) -> None:
        self.core = core
        self.config = config
        self.inputs = inputs  # zmq PULL
        self.outputs = outputs  # zmq PUSH
        self._early: list[tuple[str, EngineOutput]] = []  # refusals, sent with the next frame
        self._metrics_at = 0.0

    def serve(self) -> int:
        core = self.core
        while True:
            # Idle: sleep in the poll until the host sends something. Busy: only look.
            timeout = 0 if core.has_work() else None
            changed = False
            if self.inputs.poll(timeout):
                changed = True
                while True:
                    try:
                        frame = self.inputs.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if not self._handle(INPUT_DECODER.decode(frame.buffer).items):
                        return 0
            outputs: list[tuple[str, EngineOutput]] = []
            if core.has_work():
                try:
                    with torch.inference_mode():
                        outputs = core.step()
                except Exception as exc:
                    log.exception("engine step failed")
                    self._send(CoreFailed(reason=f"engine step failed: {exc!r}"))
                    return 1
            if self._early:
                outputs = self._early + outputs
                self._early = []
            events = core.drain_kv_events()
            if outputs or events or changed:
                self._send_step(outputs, events)

    def _send_step(self, outputs, events) -> None:
        frame = StepOutputs(outputs=outputs, kv_events=events, load=self.core.load(0))
        now = time.monotonic()
        if now - self._metrics_at >= _METRICS_INTERVAL_S:
            self._metrics_at = now
            frame.metrics = core_metrics(self.core)
        self._send(frame)

    def _send(self, message: Any) -> None:
        self.outputs.send(ENCODER.encode(message), copy=False)

    def _handle(self, items: list[CoreInput]) -> bool:
        """Apply the inputs in order; False on `Shutdown`."""
        for item in items:
            if isinstance(item, AddRequest):
                self._add(item)
            elif isinstance(item, AbortRequest):
                self.core.abort(item.request_id)
            elif isinstance(item, Call):
                self._send(self._call(item))
            elif isinstance(item, Shutdown):
                return False
        return True

    def _add(self, item: AddRequest) -> None:
        rid = item.request.request_id
        try:
            self.core.add_request(item.request)
        except EngineError as exc:  # the request's fault: a 400 at the HTTP edge
            self._early.append(
                (
                    rid,
                    EngineOutput(finish_reason="error", error=str(exc), error_code=INVALID_REQUEST),
                )
            )
        except Exception as exc:
            log.exception("request %s: could not be added", rid)
            self._early.append(
                (rid, EngineOutput(finish_reason="error", error=f"{type(exc).__name__}: {exc}"))
            )

    def _call(self, call: Call) -> CallResult:
        op = getattr(self, f"op_{call.method}", None)
        if op is None:
            return CallResult(
                call.call_id, error=f"no such call {call.method!r}", error_kind="internal"
            )
        try:
            value = op(*call.args)
        except Unsupported as exc:
            return CallResult(call.call_id, error=str(exc), error_kind="unsupported")
        except EngineError as exc:
            return CallResult(call.call_id, error=str(exc), error_kind="engine")
        except Exception as exc:
            log.exception("call %s failed", call.method)
            return CallResult(
                call.call_id, error=f"{type(exc).__name__}: {exc}", error_kind="internal"
            )
        return CallResult(call.call_id, value=value)

    # -- calls (between two steps) ---------------------------------------------------------

    def op_clear_kv(self) -> None:
        self.core.clear_kv()

    def op_kv_state(self) -> list:
        return self.core.kv_state()

    def op_sleep(self, level: int) -> None:
        self.core.sleep(level)

    def op_wake(self, tags: list[str] | None) -> bool:
        """True while still asleep (a partial wake)."""
        self.core.wake(tags)
        return self.core.asleep

    def op_load_lora(self, name: str, source: str, allowed_dirs: list[str] | None) -> str:
        """Load (or keep) an adapter; returns its resolved path. The steps wait meanwhile:
        the adapter's files are read here, in the loop's thread."""
        return load_lora(self.core, self.config, name, source, allowed_dirs)

    def op_unload_lora(self, name: str) -> bool:
        return self.core.remove_adapter(name)


def load_lora(
    core: EngineCore, config: NativeConfig, name: str, source: str, allowed: list[str] | None
) -> str:
    path = resolve_adapter(source, allowed_dirs=allowed)
    current = core.adapters.get(name)
    if current is not None and current.path == str(path):
        return current.path
    runner = core.runner
    adapter = load_adapter(name, path, runner.model, config.max_lora_rank, runner.dtype)
    if runner.device.type == "cuda":
        pin_adapter(adapter)
    core.add_adapter(adapter)
    log.info("LoRA adapter %s loaded from %s (rank %d)", name, path, adapter.rank)
    return adapter.path


def _start_core(args: dict[str, Any]) -> tuple[EngineCore, NativeConfig, list[tuple[str, str]]]:
    config = NativeConfig(**args["config"])
    if config.cpu_threads > 0:
        torch.set_num_threads(config.cpu_threads)
    core = EngineCore(config, args["model_dir"], worker_id=args["worker_id"])
    loras = []
    for item in config.lora_modules:
        name, sep, source = item.partition("=")
        if not sep or not name or not source:
            raise ValueError(f"--lora-modules entry {item!r} is not name=path")
        # Named by the operator at start: not limited to --lora-allowed-dirs.
        path = load_lora(core, config, name.strip(), source.strip(), None)
        loras.append((name.strip(), path))
    return core, config, loras


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    setup_logging(args.get("log_level", "INFO"))
    threading.Thread(target=exit_when_parent_is_gone, name="host-watch", daemon=True).start()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: where it hangs
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    inputs.connect(args["inputs"])
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)  # a frame is never dropped nor blocks the loop
    outputs.connect(args["outputs"])
    try:
        core, config, loras = _start_core(args)
    except Exception as exc:
        log.exception("engine core failed to start")
        outputs.send(ENCODER.encode(CoreFailed(reason=f"{type(exc).__name__}: {exc}")))
        outputs.close(linger=5000)
        return 1
    outputs.send(ENCODER.encode(CoreReady(info=CoreInfo.of(core), loras=loras)))
    log.info("engine core ready: %d KV blocks", core.blocks.num_blocks)
    code = CoreServer(core, config, inputs, outputs).serve()
    core.close()
    outputs.close(linger=5000)
    inputs.close(linger=0)
    context.term()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
