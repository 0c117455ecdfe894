"""Who may talk to a worker: the TCP request plane's TLS and shared-secret handshake.

A worker's request-plane port serves `generate` and its admin endpoints (`clear_kv`,
`load_lora`, `sleep`, `kv_state`): without this, anyone who reaches the port can call
them with raw frames, bypassing every check the frontend makes. Two layers, either or both:

- `--fleet-tls-cert/--fleet-tls-key/--fleet-tls-ca`: mutual TLS. Every process presents a
  certificate signed by the fleet's CA and accepts only peers that do. The CA is the
  identity (host names are not checked: pod addresses change).
- `--fleet-secret` (or `--fleet-secret-file`): a challenge-response handshake before the
  first frame, HMAC-SHA256 over both sides' nonces, so each side proves it knows the secret
  without sending it, and a recorded handshake cannot be replayed. It authenticates; it
  does not encrypt (use TLS on untrusted networks).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"STATOR-FLEET-1\n"
NONCE_BYTES = 16
MAC_BYTES = 32


@dataclass(frozen=True)
class FleetSecurity:
    secret: bytes | None = None
    server_ssl: ssl.SSLContext | None = None
    client_ssl: ssl.SSLContext | None = None

    @property
    def enabled(self) -> bool:
        return self.secret is not None or self.server_ssl is not None

    @classmethod
    def build(
        cls,
        secret: str | None = None,
        secret_file: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
    ) -> FleetSecurity:
        """From the runtime's flags; ValueError names what is missing."""
        key = secret or None
        if secret_file:
            key = Path(secret_file).read_text().strip() or None
            if key is None:
                raise ValueError(f"--fleet-secret-file {secret_file} is empty")
        tls = [tls_cert, tls_key, tls_ca]
        server_ctx = client_ctx = None
        if any(tls):
            if not all(tls):
                raise ValueError(
                    "fleet TLS needs all of --fleet-tls-cert, --fleet-tls-key, --fleet-tls-ca"
                )
            server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tls_ca)
            server_ctx.load_cert_chain(tls_cert, tls_key)  # type: ignore[arg-type]
            server_ctx.verify_mode = ssl.CERT_REQUIRED
            client_ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls_ca)
            client_ctx.load_cert_chain(tls_cert, tls_key)  # type: ignore[arg-type]
            client_ctx.check_hostname = False  # the fleet CA is the identity
            client_ctx.verify_mode = ssl.CERT_REQUIRED
        return cls(key.encode() if key else None, server_ctx, client_ctx)


def client_tls(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """A client TLS context for NATS or etcd: verify the server with `ca` (or the system's
    CAs), present `cert`/`key` when given."""
    if bool(cert) != bool(key):
        raise ValueError("a client certificate needs its key, and a key its certificate")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def _mac(secret: bytes, side: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, side + server_nonce + client_nonce, hashlib.sha256).digest()


class HandshakeFailed(Exception):
    pass


class Handshake:
    """One side of the secret handshake, fed raw bytes; `done` once the peer proved itself.

    server: sends MAGIC + server nonce; reads client nonce + client MAC; sends server MAC.
    client: reads MAGIC + server nonce; sends client nonce + client MAC; reads server MAC.
    """

    def __init__(self, secret: bytes, server: bool) -> None:
        self.secret = secret
        self.server = server
        self.done = False
        self._buffer = b""
        self._server_nonce = os.urandom(NONCE_BYTES) if server else b""
        self._client_nonce = b"" if server else os.urandom(NONCE_BYTES)

    def greeting(self) -> bytes:
        """What to send on connecting (the client sends nothing until greeted)."""
        return MAGIC + self._server_nonce if self.server else b""

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """(bytes to send to the peer, bytes left over after the handshake for frames)."""
        self._buffer += data
        if self.server:
            need = NONCE_BYTES + MAC_BYTES
            if len(self._buffer) < need:
                return b"", b""
            head, rest = self._buffer[:need], self._buffer[need:]
            self._client_nonce = head[:NONCE_BYTES]
            want = _mac(self.secret, b"client", self._server_nonce, self._client_nonce)
            if not hmac.compare_digest(head[NONCE_BYTES:], want):
                raise HandshakeFailed("the peer does not know the fleet secret")
            self.done = True
            reply = _mac(self.secret, b"server", self._server_nonce, self._client_nonce)
            return reply, rest
        if not self._server_nonce:
            need = len(MAGIC) + NONCE_BYTES
            if len(self._buffer) < need:
                if not MAGIC.startswith(self._buffer[: len(MAGIC)]):
                    raise HandshakeFailed("the peer does not speak the fleet handshake")
                return b"", b""
            if not self._buffer.startswith(MAGIC):
                raise HandshakeFailed("the peer does not speak the fleet handshake")
            self._server_nonce = self._buffer[len(MAGIC) : need]
            self._buffer = self._buffer[need:]
            mac = _mac(self.secret, b"client", self._server_nonce, self._client_nonce)
            out = self._client_nonce + mac
            more, rest = self._client_reply()
            return out + more, rest
        return self._client_reply()

    def _client_reply(self) -> tuple[bytes, bytes]:
        if len(self._buffer) < MAC_BYTES:
            return b"", b""
        mac, rest = self._buffer[:MAC_BYTES], self._buffer[MAC_BYTES:]
        want = _mac(self.secret, b"server", self._server_nonce, self._client_nonce)
        if not hmac.compare_digest(mac, want):
            raise HandshakeFailed("the worker does not know the fleet secret")
        self.done = True
        return b"", rest


__all__ = ["FleetSecurity", "Handshake", "HandshakeFailed", "client_tls"]
