"""Engines behind one interface: native (PyTorch), mocker (simulated), vllm (adapter)."""

from stator.engines.base import Engine, EngineDead, EngineError, Unsupported

__all__ = ["Engine", "EngineDead", "EngineError", "Unsupported"]
