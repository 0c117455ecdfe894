"""stator: an OpenAI-compatible, KV-aware, distributed LLM serving system."""

__version__ = "0.1.0"
