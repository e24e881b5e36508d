"""Challenge-response authentication and length-checked framing for every hora connection.

Every TCP connection hora opens — rendezvous, engine control, data — starts with this handshake before a single
byte of payload is parsed::

    server -> client  MAGIC | VERSION | server_nonce(32)
    client -> server  MAGIC | VERSION | role(1) | rank(i32) | client_nonce(32) | HMAC(secret, "c"|sn|cn|role|rank)
    server -> client  0x01 | HMAC(secret, "s"|cn|sn|role|rank)      (or 0x00 and close: rejected)

All fields have fixed sizes, so nothing of attacker-chosen length is read before the peer has proved it knows the
per-job secret; the client also checks the server's proof, so a process squatting on a port cannot pose as a peer.
After the handshake, messages are frames (:mod:`hora._wire`): an 8-byte big-endian length checked against a limit
*before* any buffer is allocated, then the payload.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import socket
import struct

from hora._wire import recv_exact
from hora.errors import AuthenticationError, PeerLostError, ProtocolError

__all__ = [
    "Role",
    "client_handshake",
    "new_secret",
    "server_handshake",
]

MAGIC = b"HORA"
VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32
SECRET_BYTES = 32
_HELLO = struct.Struct("!4sB32s")
_CLIENT = struct.Struct("!4sBBi32s32s")


class Role(enum.IntEnum):
    """What a connection is for; part of the authenticated handshake so one kind cannot pose as another."""

    RENDEZVOUS = 1
    CONTROL = 2
    DATA = 3
    AGENT = 4  # hora job: a host's agent, asked to run a command for the master host (hora.jobs._host)
    PS = 5  # a worker's connection to a parameter server (hora.ps)


def new_secret() -> bytes:
    """A fresh per-job secret (32 random bytes)."""
    return secrets.token_bytes(SECRET_BYTES)


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def client_handshake(sock: socket.socket, secret: bytes, role: Role, rank: int, timeout: float) -> None:
    """Authenticate to a hora server as ``rank`` for ``role``; raise :class:`AuthenticationError` on failure."""
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        hello = recv_exact(sock, _HELLO.size, "server")
        magic, version, server_nonce = _HELLO.unpack(hello)
        if magic != MAGIC:
            raise ProtocolError("the server is not a hora server (bad magic in its greeting)")
        if version != VERSION:
            raise ProtocolError(f"the server speaks hora protocol {version}, this process speaks {VERSION}")
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        ident = struct.pack("!Bi", int(role), rank)
        proof = _mac(secret, b"c", server_nonce, client_nonce, ident)
        sock.sendall(_CLIENT.pack(MAGIC, VERSION, int(role), rank, client_nonce, proof))
        status = recv_exact(sock, 1, "server")
        if status != b"\x01":
            raise AuthenticationError(
                "the server rejected this process's credentials: it belongs to another job or the secret differs "
                "(check HORA_SECRET / HORA_SECRET_FILE)"
            )
        server_proof = recv_exact(sock, MAC_BYTES, "server")
        if not hmac.compare_digest(server_proof, _mac(secret, b"s", client_nonce, server_nonce, ident)):
            raise AuthenticationError(
                "the server could not prove it knows the job secret; refusing to talk to it"
            )
    except TimeoutError as exc:
        raise AuthenticationError(f"handshake with the server timed out after {timeout:g}s") from exc
    except PeerLostError as exc:
        raise ProtocolError(f"the server closed the connection during the handshake ({exc})") from exc
    finally:
        sock.settimeout(previous)


def server_handshake(
    sock: socket.socket, secret: bytes, timeout: float, roles: tuple[Role, ...] | None = None
) -> tuple[Role, int]:
    """Authenticate a client that just connected; return its (role, rank) or raise.

    Raises :class:`AuthenticationError` for a wrong secret or a role this server does not serve and
    :class:`ProtocolError` for bytes that are not hora's handshake; the caller closes the socket either way.
    """
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(_HELLO.pack(MAGIC, VERSION, server_nonce))
        data = recv_exact(sock, _CLIENT.size, "client")
        magic, version, role_value, rank, client_nonce, proof = _CLIENT.unpack(data)
        if magic != MAGIC or version != VERSION:
            raise ProtocolError("a client sent bytes that are not a hora handshake")
        ident = struct.pack("!Bi", role_value, rank)
        if not hmac.compare_digest(proof, _mac(secret, b"c", server_nonce, client_nonce, ident)):
            _send_quietly(sock, b"\x00")
            raise AuthenticationError("a client failed authentication (wrong secret or another job)")
        try:
            role = Role(role_value)
        except ValueError:
            role = None
        if role is None or (roles is not None and role not in roles):
            _send_quietly(sock, b"\x00")
            raise AuthenticationError(
                f"a client asked for role {role_value}, which this server does not serve"
            )
        sock.sendall(b"\x01" + _mac(secret, b"s", client_nonce, server_nonce, ident))
        return role, rank
    except TimeoutError as exc:
        raise AuthenticationError(f"a client did not complete the handshake within {timeout:g}s") from exc
    except PeerLostError as exc:
        raise ProtocolError(f"a client left during the handshake ({exc})") from exc
    finally:
        sock.settimeout(previous)


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass
