"""Discovery backends behind one interface; `open_discovery(url)` picks one.

- `mem` or `mem:NAME`: in-process (NAME selects a separate store, for tests)
- `file:DIR`: a directory shared by processes on one host, entries expire without heartbeat
- `etcd://host:port[,host:port...]`: etcd v3 with leases, keep-alive and watch
"""

from __future__ import annotations

from typing import Any

from stator.runtime.discovery.base import Discovery, WatchEvent
from stator.runtime.discovery.mem import MemDiscovery, mem_store


def open_discovery(url: str, *, ttl: float = 5.0, **etcd_options: Any) -> Discovery:
    """A (not yet started) discovery client for `url`. `ttl`: lease lifetime in seconds
    for backends with leases (file, etcd)."""
    if url == "mem" or url.startswith("mem:"):
        name = url.split(":", 1)[1] if ":" in url else "default"
        return MemDiscovery(name or "default")
    if url.startswith("file:"):
        from stator.runtime.discovery.file import FileDiscovery

        path = url[len("file:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError("file discovery needs a directory: file:/path/to/dir")
        return FileDiscovery(path, ttl=ttl)
    if url.startswith("etcd://"):
        from stator.runtime.discovery.etcd import EtcdDiscovery

        return EtcdDiscovery(url[len("etcd://") :], ttl=ttl, **etcd_options)
    raise ValueError(f"unknown discovery backend {url!r}: use mem, file:DIR or etcd://host:port")


__all__ = ["Discovery", "MemDiscovery", "WatchEvent", "mem_store", "open_discovery"]
