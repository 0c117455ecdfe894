"""LoRA adapters loaded into a running vLLM engine, one served model name each.

vLLM bug guarded here: on the CPU build, a base-model request batched with LoRA requests
is computed with the *last* adapter slot when every slot is taken (the no-LoRA index -1
selects the last slot; upstream PR vllm-project/vllm#48421). Keeping one of `max_loras`
slots always free keeps that slot zero, so at most `max_loras - 1` adapters are loaded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import unquote, urlparse

import xxhash
from vllm.lora.request import LoRARequest

from stator.engines.base import EngineError
from stator.protocols import LoraInfo


def lora_id(name: str) -> int:
    """A stable positive int32 id for an adapter name (vLLM wants ints; 0 means none)."""
    return xxhash.xxh32_intdigest(name.encode()) % 0x7FFFFFFE + 1


def local_adapter_dir(source: str) -> Path:
    """A local directory from a path or a `file://` URI; EngineError if it is not one."""
    if "://" in source:
        parsed = urlparse(source)
        if parsed.scheme != "file":
            raise EngineError(f"LoRA source {source!r}: only local paths and file:// URIs work")
        source = unquote(parsed.path)
    path = Path(source).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise EngineError(f"LoRA source {source!r} is not a PEFT adapter directory")
    return path.resolve()


class LoraSet:
    """The adapters loaded now (name -> request), with the slot limit."""

    def __init__(self, base_model: str, max_adapters: int) -> None:
        self.base_model = base_model
        self.max_adapters = max_adapters
        self.loaded: dict[str, LoRARequest] = {}
        self.lock = asyncio.Lock()

    def request_for(self, name: str | None) -> LoRARequest | None:
        """The LoRARequest a generate call names (None for the base model)."""
        if not name or name == self.base_model:
            return None
        lora = self.loaded.get(name)
        if lora is None:
            raise EngineError(f"LoRA adapter {name!r} is not loaded")
        return lora

    def adapter_named(self, model: str) -> str | None:
        return model if model in self.loaded else None

    def new_request(self, name: str, path: Path) -> LoRARequest:
        if name == self.base_model:
            raise EngineError(f"a LoRA adapter cannot take the base model's name {name!r}")
        if self.max_adapters <= 0:
            raise EngineError("LoRA is not enabled: start the worker with --enable-lora")
        if name not in self.loaded and len(self.loaded) >= self.max_adapters:
            raise EngineError(
                f"{len(self.loaded)} LoRA adapters are loaded, the most this engine serves "
                f"correctly (max_loras - 1); unload one or raise --max-loras"
            )
        return LoRARequest(lora_name=name, lora_int_id=lora_id(name), lora_path=str(path))

    def info(self, name: str) -> LoraInfo:
        return LoraInfo(name=name, path=self.loaded[name].lora_path, base_model=self.base_model)

    def infos(self) -> list[LoraInfo]:
        return [self.info(name) for name in sorted(self.loaded)]
