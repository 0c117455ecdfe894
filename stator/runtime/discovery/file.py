"""File discovery: processes on one host share a directory.

    DIR/leases/<lease hex>   one per live owner; its mtime is the owner's last heartbeat
    DIR/keys/<quoted key>    msgpack [lease id, value], written atomically (temp + rename)

An owner touches its lease file every ttl/3. A key whose lease file is missing or older
than `ttl` is expired: readers treat it as gone and delete it, so a `kill -9`ed owner's
keys disappear within ttl. An owner that was merely slow (and lost keys to a reader's
sweep) writes them back on its next heartbeat. Watches poll the directory.

File operations are synchronous: on a local directory they take microseconds, less than
handing them to a thread would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from stator.runtime.discovery.base import Discovery, WatchEvent

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.15
_entry_decoder = msgspec.msgpack.Decoder(tuple[int, bytes])
_encoder = msgspec.msgpack.Encoder()


def key_to_filename(key: str) -> str:
    # Everything but [A-Za-z0-9_.-] is %-escaped ('/' too), so any key is one flat name;
    # a leading '.' is escaped so that names starting with '.' are free for temp files.
    name = urllib.parse.quote(key, safe="-_.")
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name.encode()) > 255:
        raise ValueError(f"discovery key too long for file discovery: {key!r}")
    return name


def filename_to_key(name: str) -> str:
    return urllib.parse.unquote(name)


class FileDiscovery(Discovery):
    def __init__(self, directory: str | os.PathLike, ttl: float = 5.0) -> None:
        if ttl <= 0:
            raise ValueError(f"discovery ttl must be positive, got {ttl}")
        self.root = Path(directory)
        self.ttl = ttl
        self.keys_dir = self.root / "keys"
        self.leases_dir = self.root / "leases"
        self.lease_id = random.getrandbits(63) or 1
        self._owned: dict[str, bytes] = {}
        self._cache: dict[str, tuple[tuple[int, int, int], int, bytes]] = {}
        self._heartbeat: asyncio.Task | None = None
        self._closed = asyncio.Event()
        self._started = False

    @property
    def _lease_file(self) -> Path:
        return self.leases_dir / f"{self.lease_id:016x}"

    async def start(self) -> None:
        if self._started:
            return
        # Private: the entries list every worker's request-plane address (the directory
        # is for processes of one user on one host).
        self.keys_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.keys_dir.mkdir(mode=0o700, exist_ok=True)
        self.leases_dir.mkdir(mode=0o700, exist_ok=True)
        while True:  # a fresh lease id that no live or dead owner has used
            try:
                fd = os.open(self._lease_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                os.close(fd)
                break
            except FileExistsError:
                self.lease_id = random.getrandbits(63) or 1
        self._started = True
        self._heartbeat = asyncio.create_task(self._beat(), name="file discovery heartbeat")

    async def _beat(self) -> None:
        while not self._closed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), self.ttl / 3)
            if self._closed.is_set():
                return
            try:
                self._touch_lease()
                for key, value in list(self._owned.items()):
                    if not (self.keys_dir / key_to_filename(key)).exists():
                        log.warning("rewriting discovery key %s, swept while we were slow", key)
                        self._write(key, value)
            except OSError as exc:
                log.warning("file discovery heartbeat failed: %s", exc)

    def _touch_lease(self) -> None:
        try:
            os.utime(self._lease_file)
        except FileNotFoundError:
            self._lease_file.touch(mode=0o600)

    def _write(self, key: str, value: bytes) -> None:
        final = self.keys_dir / key_to_filename(key)
        tmp = self.keys_dir / f".tmp-{self.lease_id:x}-{random.getrandbits(32):x}"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_encoder.encode((self.lease_id, value)))
        os.replace(tmp, final)

    async def put(self, key: str, value: bytes) -> None:
        self._check_open()
        await self.start()
        self._touch_lease()
        self._write(key, value)
        self._owned[key] = value

    async def delete(self, key: str) -> None:
        self._owned.pop(key, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.keys_dir / key_to_filename(key))

    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        return self._scan(prefix)

    def _scan(self, prefix: str) -> dict[str, bytes]:
        """Every live key under `prefix`; sweeps expired entries and stale temp files."""
        now = time.time()
        lease_alive: dict[int, bool] = {}
        live: dict[str, bytes] = {}
        try:
            entries = list(os.scandir(self.keys_dir))
        except FileNotFoundError:
            return live
        for name in self._cache.keys() - {e.name for e in entries}:
            del self._cache[name]
        for entry in entries:
            name = entry.name
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if name.startswith("."):
                if now - st.st_mtime > max(self.ttl, 60.0):  # a writer died mid-write
                    _unlink(entry.path)
                continue
            key = filename_to_key(name)
            if not key.startswith(prefix):
                continue
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._cache.get(name)
            if cached is not None and cached[0] == stamp:
                lease, value = cached[1], cached[2]
            else:
                try:
                    lease, value = _entry_decoder.decode(Path(entry.path).read_bytes())
                except FileNotFoundError:
                    continue
                except (msgspec.DecodeError, msgspec.ValidationError):
                    log.warning("ignoring malformed discovery file %s", entry.path)
                    continue
                self._cache[name] = (stamp, lease, value)
            alive = lease_alive.get(lease)
            if alive is None:
                alive = lease_alive[lease] = self._lease_alive(lease, now)
            if alive:
                live[key] = value
            else:
                _unlink(entry.path)
                self._cache.pop(name, None)
        return live

    def _lease_alive(self, lease: int, now: float) -> bool:
        if lease == self.lease_id and self._started and not self._closed.is_set():
            return True
        path = self.leases_dir / f"{lease:016x}"
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:
            return False
        if age > self.ttl:
            _unlink(path)
            return False
        return True

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        self._check_open()
        seen: dict[str, bytes] = {}
        while True:
            current = self._scan(prefix)
            for key, value in current.items():
                if seen.get(key) != value:
                    yield WatchEvent("put", key, value)
            for key in seen.keys() - current.keys():
                yield WatchEvent("delete", key)
            seen = current
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), POLL_INTERVAL)
            if self._closed.is_set():
                return

    async def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._heartbeat is not None:
            await self._heartbeat
        for key in list(self._owned):
            await self.delete(key)
        if self._started:
            _unlink(self._lease_file)

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RuntimeError("discovery is closed")


def _unlink(path: str | os.PathLike) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
