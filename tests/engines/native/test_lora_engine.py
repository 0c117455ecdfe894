"""Run-time LoRA loads in the async native engine: allow-list, atomic loads, under load."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from stator.engines.base import EngineError, Unsupported
from stator.engines.native import NativeConfig, create_engine
from tests.engines.native.lora_adapters import build_adapter
from tests.engines.native.models import greedy_request, hf_greedy, prompt

pytest.importorskip("peft")
TIMEOUT = 120


@pytest.fixture(scope="module")
def adapter_root(llama, tmp_path_factory):
    _, hf = llama
    root = tmp_path_factory.mktemp("allowed")
    refs = {}
    for i, name in enumerate(["a1", "a2"]):
        refs[name] = build_adapter(hf, root / name, seed=10 + i)[1]
    return root, refs


async def started(model_dir, **overrides):
    values = dict(device="cpu", dtype="float32", kv_cache_memory="4MiB", enable_lora=True)
    values.update(overrides)
    engine = create_engine(NativeConfig(**values), str(model_dir), "tiny")
    await engine.start()
    return engine


async def tokens(engine, request):
    out = []
    async for o in engine.generate(request):
        out.extend(o.token_ids)
    return out


async def test_load_list_generate_unload(llama, adapter_root):
    model_dir, _ = llama
    root, refs = adapter_root
    engine = await started(model_dir, lora_allowed_dirs=[str(root)])
    try:
        info = await engine.load_lora("a1", str(root / "a1"))
        assert info.name == "a1" and info.base_model == "tiny"
        assert [i.name for i in engine.list_loras()] == ["a1"]
        assert [i.name for i in engine.model_card().loras] == ["a1"]
        ids = prompt(3, 12)
        # Named by lora_name, or by the adapter's own model name (its card).
        req = greedy_request("r1", ids, 5)
        req.lora_name = "a1"
        expected = hf_greedy(refs["a1"], ids, 5)
        assert await asyncio.wait_for(tokens(engine, req), TIMEOUT) == expected
        req2 = greedy_request("r2", ids, 5)
        req2.model = "a1"
        assert await asyncio.wait_for(tokens(engine, req2), TIMEOUT) == expected
        await engine.unload_lora("a1")
        assert engine.list_loras() == []
        with pytest.raises(EngineError, match="not loaded"):
            await engine.unload_lora("a1")
        req3 = greedy_request("r3", ids, 5)
        req3.lora_name = "a1"
        with pytest.raises(EngineError, match="not loaded"):
            await tokens(engine, req3)
    finally:
        await engine.shutdown()


async def test_paths_outside_the_allowed_dirs_and_bad_adapters_register_nothing(
    llama, adapter_root, tmp_path
):
    model_dir, _ = llama
    root, _ = adapter_root
    engine = await started(model_dir, lora_allowed_dirs=[str(tmp_path)])
    try:
        with pytest.raises(EngineError, match="outside --lora-allowed-dirs"):
            await engine.load_lora("a1", str(root / "a1"))
        with pytest.raises(EngineError, match="outside --lora-allowed-dirs"):
            await engine.load_lora("a1", str(tmp_path / ".." / root.name / "a1"))
        broken = tmp_path / "broken"
        shutil.copytree(root / "a1", broken)
        (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
        with pytest.raises(Exception):  # noqa: B017  (whatever safetensors raises)
            await engine.load_lora("broken", str(broken))
        with pytest.raises(EngineError, match="base model"):
            await engine.load_lora("tiny", str(broken))
        assert engine.list_loras() == []
    finally:
        await engine.shutdown()


async def test_lora_off_and_no_allowed_dirs(llama, adapter_root):
    model_dir, _ = llama
    root, _ = adapter_root
    engine = await started(model_dir, enable_lora=False)
    try:
        with pytest.raises(Unsupported, match="--enable-lora"):
            await engine.load_lora("a1", str(root / "a1"))
    finally:
        await engine.shutdown()
    engine = await started(model_dir)
    try:
        with pytest.raises(EngineError, match="none are allowed"):
            await engine.load_lora("a1", str(root / "a1"))
    finally:
        await engine.shutdown()


async def test_start_time_modules_skip_the_allow_list(llama, adapter_root):
    model_dir, _ = llama
    root, _ = adapter_root
    engine = await started(model_dir, lora_modules=[f"a2={root / 'a2'}"])
    try:
        assert [i.name for i in engine.list_loras()] == ["a2"]
    finally:
        await engine.shutdown()


async def test_concurrent_loads_of_one_name_and_loads_under_load(llama, adapter_root):
    model_dir, hf = llama
    root, refs = adapter_root
    engine = await started(model_dir, lora_allowed_dirs=[str(root)], max_loras=2)
    try:
        infos = await asyncio.gather(*(engine.load_lora("a1", str(root / "a1")) for _ in range(4)))
        assert {i.path for i in infos} == {str((root / "a1").resolve())}
        models = {None: hf, "a1": refs["a1"], "a2": refs["a2"]}

        async def one(i, lora, running=None):
            ids = prompt(100 + i, 9 + i % 5)
            req = greedy_request(f"q{i}", ids, 6)
            req.lora_name = lora
            got = []
            async for out in engine.generate(req):
                got.extend(out.token_ids)
                if running is not None:
                    running.set()
            return got, hf_greedy(models[lora], ids, 6)

        first = [asyncio.create_task(one(i, [None, "a1"][i % 2])) for i in range(6)]
        await engine.load_lora("a2", str(root / "a2"))  # while those run
        events = [asyncio.Event() for _ in range(6)]
        second = [
            asyncio.create_task(one(10 + i, ["a2", "a1", None][i % 3], events[i])) for i in range(6)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), TIMEOUT)
        await engine.unload_lora("a1")  # requests already running keep their adapter
        for got, expected in await asyncio.wait_for(asyncio.gather(*first, *second), TIMEOUT):
            assert got == expected
        assert [i.name for i in engine.list_loras()] == ["a2"]
    finally:
        await engine.shutdown()
