"""Errors the router raises to the frontend."""


class Overloaded(Exception):
    """Every worker is over its busy threshold (and the queue, if any, is full): the
    frontend answers 503 with `Retry-After: retry_after` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BadRouting(ValueError):
    """The request cannot be routed as asked (e.g. `direct` mode without a worker id):
    the frontend answers 400."""
