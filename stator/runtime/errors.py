"""Errors the runtime raises to callers. The distinction that matters is whether a failed
stream may be retried elsewhere (migrated): `Migratable` ones may."""


class RuntimeErrorBase(Exception):
    """Base of all runtime errors."""


class Migratable(RuntimeErrorBase):
    """The stream failed because of its worker, not because of the request: it may be
    re-sent to another instance."""


class StreamDisconnected(Migratable):
    """The peer went away (crashed, was killed, lost the connection) mid-stream."""


class CannotConnect(Migratable):
    """The instance could not be reached at all."""


class EngineShutdown(Migratable):
    """The worker is shutting down and gave up the stream before it finished."""


class RemoteError(RuntimeErrorBase):
    """The handler on the other side raised; the message says what went wrong."""


class EndpointNotFound(RuntimeErrorBase):
    """The instance is reachable but does not serve that endpoint."""


class NoInstances(RuntimeErrorBase):
    """No live instance serves the endpoint."""


class DiscoveryUnavailable(RuntimeErrorBase):
    """The discovery backend cannot be reached."""


class EventPlaneUnavailable(RuntimeErrorBase):
    """The event-plane server (NATS) cannot be reached."""


class ConnectionRefused(CannotConnect):
    """Nothing listens at the instance's address any more (a killed worker whose
    discovery entry has not expired yet): the caller marks the instance down at once."""
