"""The disk tier: one file per block in a directory, LRU within a byte budget.

A file is `<sequence hash, 16 hex digits>.kv`: a 4-byte header length, a msgpack header
(parent hash, token ids) and the block's raw data, block-major as in the host tier. Files
are written by one background thread (to a temporary name, then renamed, so a crash never
leaves a torn block under a real name); a block whose file is not written yet is read from
the buffer waiting to be written.

The tier survives a restart: `layout.json` names the block shape, dtype and model; a worker
that finds the same layout indexes the files already there (oldest modification first in
the LRU order) and announces them as disk-tier blocks; any other layout is wiped (the `.kv`
files only) so stale KV can never be loaded into another model.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import struct
import threading
from collections import OrderedDict
from pathlib import Path

import msgspec
import numpy as np

from stator.kv.offload.host import BlockMeta

log = logging.getLogger(__name__)

_LEN = struct.Struct("<I")
_SUFFIX = ".kv"


class _Header(msgspec.Struct, array_like=True):
    parent_hash: int | None
    token_ids: list[int]
    lora_name: str | None = None


class DiskTier:
    def __init__(self, directory: str | Path, capacity_blocks: int, block_bytes: int, layout: dict):
        if capacity_blocks < 1:
            raise ValueError("the disk tier needs room for at least one block")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity_blocks
        self.block_bytes = block_bytes
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.meta: dict[int, BlockMeta] = {}
        self._pending: dict[int, np.ndarray] = {}  # written soon; read from here meanwhile
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._adopt(layout)
        self._thread = threading.Thread(target=self._write_loop, name="kv-disk", daemon=True)
        self._thread.start()

    # -- start-up ----------------------------------------------------------------------

    def _adopt(self, layout: dict) -> None:
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        path = self.dir / "layout.json"
        try:
            same = json.loads(path.read_text()) == layout
        except (OSError, ValueError):
            same = False
        files = sorted(self.dir.glob("*" + _SUFFIX), key=lambda p: p.stat().st_mtime)
        if not same:
            if files:
                log.info("disk KV tier %s: another layout, %d blocks dropped", self.dir, len(files))
            for f in files:
                f.unlink(missing_ok=True)
            path.write_text(json.dumps(layout))
            return
        for f in files:
            try:
                block_hash = int(f.stem, 16)
                header = self._read_header(f)
            except (OSError, ValueError, msgspec.DecodeError):
                f.unlink(missing_ok=True)
                continue
            self._lru[block_hash] = None
            self.meta[block_hash] = BlockMeta(
                header.parent_hash, tuple(header.token_ids), header.lora_name
            )
        while len(self._lru) > self.capacity:  # the budget may have shrunk
            self._delete(self._lru.popitem(last=False)[0])
        if self._lru:
            log.info("disk KV tier %s: %d blocks found from an earlier run", self.dir, len(self))

    def _read_header(self, path: Path) -> _Header:
        with path.open("rb") as f:
            (n,) = _LEN.unpack(f.read(_LEN.size))
            return msgspec.msgpack.decode(f.read(n), type=_Header)

    # -- the index ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def hashes(self) -> list[int]:
        return list(self._lru)

    def touch(self, block_hash: int) -> None:
        self._lru.move_to_end(block_hash)

    def put(self, block_hash: int, meta: BlockMeta, data: np.ndarray) -> list[int]:
        """Store a block (a uint8 copy the tier now owns); returns the hashes evicted."""
        if block_hash in self._lru:
            self.touch(block_hash)
            return []
        evicted = []
        while len(self._lru) >= self.capacity:
            old = self._lru.popitem(last=False)[0]
            self._delete(old)
            evicted.append(old)
        self._lru[block_hash] = None
        self.meta[block_hash] = meta
        with self._lock:
            self._pending[block_hash] = data
        self._queue.put(("write", block_hash, meta, data))
        return evicted

    def read_into(self, block_hash: int, out: np.ndarray) -> None:
        """Copy the block's data into `out` (a uint8 view of a host slot)."""
        with self._lock:
            data = self._pending.get(block_hash)
        if data is not None:
            out[:] = data
            return
        with self._path(block_hash).open("rb") as f:
            (n,) = _LEN.unpack(f.read(_LEN.size))
            f.seek(n, os.SEEK_CUR)
            if f.readinto(memoryview(out)) != self.block_bytes:
                raise OSError(f"disk KV block {block_hash:016x} is truncated")

    def remove(self, block_hash: int) -> None:
        if block_hash in self._lru:
            del self._lru[block_hash]
            self._delete(block_hash)

    def clear(self) -> None:
        for h in list(self._lru):
            self.remove(h)

    def flush(self) -> None:
        """Wait until every queued write and delete is done (tests, shutdown)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    # -- files ---------------------------------------------------------------------------

    def _path(self, block_hash: int) -> Path:
        return self.dir / f"{block_hash:016x}{_SUFFIX}"

    def _delete(self, block_hash: int) -> None:
        self.meta.pop(block_hash, None)
        with self._lock:
            data = self._pending.get(block_hash)
        self._queue.put(("delete", block_hash, None, data))

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            op, block_hash, meta, data = item
            try:
                path = self._path(block_hash)
                if op == "delete":
                    path.unlink(missing_ok=True)
                    with self._lock:
                        if data is not None and self._pending.get(block_hash) is data:
                            del self._pending[block_hash]
                else:
                    header = msgspec.msgpack.encode(
                        _Header(meta.parent_hash, list(meta.token_ids), meta.lora_name)
                    )
                    tmp = path.with_suffix(".tmp")
                    with tmp.open("wb") as f:
                        f.write(_LEN.pack(len(header)))
                        f.write(header)
                        f.write(memoryview(data))
                    os.replace(tmp, path)
                    with self._lock:
                        if self._pending.get(block_hash) is data:
                            del self._pending[block_hash]
            except OSError:
                log.exception("disk KV tier: %s of block %016x failed", op, block_hash)
            finally:
                self._queue.task_done()
        self._queue.task_done()
