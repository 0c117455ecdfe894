import asyncio
import os
import time

import pytest

from stator.runtime.discovery import open_discovery
from stator.runtime.discovery.file import FileDiscovery, filename_to_key, key_to_filename


def test_keys_map_to_flat_safe_file_names():
    for key in ["v1/instances/a/b/c/1f", "../etc/passwd", ".hidden", "sp ace%/x"]:
        name = key_to_filename(key)
        assert "/" not in name and not name.startswith(".")
        assert filename_to_key(name) == key
    with pytest.raises(ValueError, match="too long"):
        key_to_filename("k" * 300)


async def test_put_get_delete_and_close(tmp_path):
    a = open_discovery(f"file:{tmp_path}", ttl=5)
    b = open_discovery(f"file:{tmp_path}", ttl=5)
    assert isinstance(a, FileDiscovery)
    await a.start()
    await b.start()
    assert a.lease_id != b.lease_id
    await a.put("v1/x/one", b"1")
    await a.put("v1/x/two", b"2")
    await b.put("v1/y/three", b"3")
    assert await b.get_prefix("v1/x/") == {"v1/x/one": b"1", "v1/x/two": b"2"}
    await a.put("v1/x/one", b"uno")
    await b.delete("v1/x/two")
    assert await b.get_prefix("v1/") == {"v1/x/one": b"uno", "v1/y/three": b"3"}
    await a.close()
    assert await b.get_prefix("v1/") == {"v1/y/three": b"3"}
    await b.close()
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "keys").iterdir())


async def test_watch_sees_snapshot_then_changes(tmp_path):
    a = FileDiscovery(tmp_path, ttl=5)
    b = FileDiscovery(tmp_path, ttl=5)
    await a.put("p/k1", b"1")
    events = []

    async def watch():
        async for event in b.watch("p/"):
            events.append((event.kind, event.key, event.value))

    task = asyncio.create_task(watch())
    await _until(lambda: len(events) == 1)
    await a.put("p/k2", b"2")
    await a.put("other/k", b"x")
    await _until(lambda: len(events) == 2)
    await a.delete("p/k1")
    await _until(lambda: len(events) == 3)
    await b.close()  # closing the discovery ends its watches
    await asyncio.wait_for(task, 5)
    assert events == [("put", "p/k1", b"1"), ("put", "p/k2", b"2"), ("delete", "p/k1", b"")]
    await a.close()


async def test_entries_of_a_silent_owner_expire(tmp_path):
    owner = FileDiscovery(tmp_path, ttl=0.5)
    reader = FileDiscovery(tmp_path, ttl=0.5)
    await owner.put("k/a", b"1")
    # Simulate kill -9: the heartbeat stops, nothing is cleaned up.
    owner._heartbeat.cancel()
    old = time.time() - 1.0
    os.utime(owner._lease_file, (old, old))
    assert await reader.get_prefix("k/") == {}
    assert not (tmp_path / "keys" / key_to_filename("k/a")).exists()
    await reader.close()


async def test_a_slow_owner_rewrites_swept_keys(tmp_path):
    owner = FileDiscovery(tmp_path, ttl=0.6)
    reader = FileDiscovery(tmp_path, ttl=0.6)
    await owner.put("k/a", b"1")
    os.unlink(tmp_path / "keys" / key_to_filename("k/a"))  # as a reader's sweep would
    os.unlink(owner._lease_file)
    await _until(lambda: (tmp_path / "keys" / key_to_filename("k/a")).exists())
    assert await reader.get_prefix("k/") == {"k/a": b"1"}
    await owner.close()
    await reader.close()


async def test_heartbeat_keeps_entries_alive(tmp_path):
    owner = FileDiscovery(tmp_path, ttl=0.3)
    reader = FileDiscovery(tmp_path, ttl=0.3)
    await owner.put("k/a", b"1")
    await asyncio.sleep(1.0)
    assert await reader.get_prefix("k/") == {"k/a": b"1"}
    await owner.close()
    await reader.close()


def test_bad_urls_and_ttl():
    with pytest.raises(ValueError, match="directory"):
        open_discovery("file:")
    with pytest.raises(ValueError, match="ttl"):
        FileDiscovery("/tmp/x", ttl=0)


async def _until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_malformed_files_are_ignored(tmp_path):
    disc = FileDiscovery(tmp_path, ttl=5)
    await disc.put("k/good", b"1")
    (tmp_path / "keys" / key_to_filename("k/bad")).write_bytes(b"not msgpack at all")
    assert await disc.get_prefix("k/") == {"k/good": b"1"}
    await disc.close()
