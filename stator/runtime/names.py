"""Names of things in the fleet, and the discovery keys derived from them.

An endpoint is `namespace.component.endpoint` (e.g. `stator.backend.generate`); an
instance is one process (one `Runtime`) serving it, named by a 63-bit instance id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

_PART = re.compile(r"^[A-Za-z0-9_\-]+$")


@dataclass(frozen=True, slots=True)
class EndpointName:
    namespace: str
    component: str
    endpoint: str

    @classmethod
    def parse(cls, text: str) -> EndpointName:
        """Parse `ns.component.endpoint` (an optional `dyn://` or `stator://` prefix is
        accepted for familiarity)."""
        for prefix in ("stator://", "dyn://"):
            if text.startswith(prefix):
                text = text[len(prefix) :]
        parts = text.split(".")
        if len(parts) != 3 or not all(_PART.match(p) for p in parts):
            raise ValueError(
                f"endpoint name must look like namespace.component.endpoint, got {text!r}"
            )
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.namespace}.{self.component}.{self.endpoint}"

    def sibling(self, endpoint: str) -> EndpointName:
        """Another endpoint of the same component (e.g. `generate` -> `admin`)."""
        return EndpointName(self.namespace, self.component, endpoint)

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.component}/{self.endpoint}"


def as_endpoint(name: str | EndpointName) -> EndpointName:
    return name if isinstance(name, EndpointName) else EndpointName.parse(name)


# Prefill workers of disaggregated serving register under this component (`ns.prefill.
# generate`), so a frontend finds them apart from the model's decode workers.
PREFILL_COMPONENT = "prefill"

INSTANCES_ROOT = "v1/instances/"
MODELS_ROOT = "v1/models/"
EVENT_CHANNELS_ROOT = "v1/event_channels/"


def instance_key(name: EndpointName, instance_id: int) -> str:
    return f"{INSTANCES_ROOT}{name.path}/{instance_id:x}"


def instances_prefix(name: EndpointName) -> str:
    return f"{INSTANCES_ROOT}{name.path}/"


def model_key(name: EndpointName, instance_id: int, suffix: str | None = None) -> str:
    key = f"{MODELS_ROOT}{name.path}/{instance_id:x}"
    return f"{key}/{suffix}" if suffix else key


def models_prefix(namespace: str | None = None) -> str:
    return f"{MODELS_ROOT}{namespace}/" if namespace else MODELS_ROOT


def event_channel_key(namespace: str, topic: str, instance_id: int) -> str:
    return f"{EVENT_CHANNELS_ROOT}{namespace}/{topic}/{instance_id:x}"


def instance_id_from_key(key: str) -> int:
    """The instance id in an instance or model-card key."""
    parts = key.split("/")
    # v1/<root>/<ns>/<comp>/<ep>/<id>[/<suffix>]
    return int(parts[5], 16)


class InstanceInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A discovery record: where one instance of an endpoint can be reached."""

    instance_id: int
    namespace: str
    component: str
    endpoint: str
    transport: Literal["inproc", "tcp"]
    address: str
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def name(self) -> EndpointName:
        return EndpointName(self.namespace, self.component, self.endpoint)
