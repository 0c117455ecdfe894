"""KV transfer between a prefill and a decode worker: one connector interface
(`KvSource` on the prefill side, `KvPuller` on the decode side), transports behind it."""

from stator.kv.transfer.config import KINDS, TransferConfig

__all__ = ["KINDS", "TransferConfig"]
