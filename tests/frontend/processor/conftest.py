"""The vLLM tests' environment (CPU KV space, offline, caches) and their `fleet` fixture,
for the processor tests that run vLLM (.ci/vllm.sh runs this folder in its venv)."""

from tests.engines.vllm.conftest import fleet  # noqa: F401
