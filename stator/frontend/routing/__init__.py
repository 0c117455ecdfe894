"""The router client: a model's routers over its workers, a choice's stream back from
them, and the routing hints a request carries."""

from stator.frontend.routing.choices import (
    ChoiceStream,
    EngineFailed,
    close_all,
    merged_deltas,
    prime_all,
)
from stator.frontend.routing.client import RouterClient

__all__ = [
    "ChoiceStream",
    "EngineFailed",
    "RouterClient",
    "close_all",
    "merged_deltas",
    "prime_all",
]
