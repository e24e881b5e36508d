"""Who may read the dashboard: loopback by default, a token for anything else, and headers that keep pages inert.

- Bound to a loopback address without a token, a request must name a loopback host in its ``Host`` header: a web
  page elsewhere cannot reach the dashboard through a DNS name that resolves to 127.0.0.1 (DNS rebinding).
- With a token (always when bound to another address: :func:`needs_token`), every request carries it, as
  ``Authorization: Bearer TOKEN``, the ``hora_token`` cookie, or ``?token=TOKEN`` on a page (which sets the cookie,
  HttpOnly and SameSite=Strict, and redirects to the address without it, so the token leaves the address bar and
  browser history). Tokens are compared in constant time.
- Every response forbids framing and sniffing and allows scripts and data only from the dashboard itself.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["Access", "is_loopback", "needs_token"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "hora_token"
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    ),
]
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def needs_token(bind: str) -> bool:
    """Whether binding to ``bind`` requires a token (anything but a loopback address)."""
    return not is_loopback(bind)


class Access:
    """ASGI middleware applying the rules of the module docstring in front of ``app``."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.token is None and not is_loopback(_host_name(headers.get("host", ""))):
            await _refuse(send, 403, "this dashboard answers only to a loopback address (localhost, 127.0.0.1); "
                                     "to open it from elsewhere, start it with --host and use the token it prints")
            return
        if self.token is not None:
            query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = query.get("token", [None])[0]
            if given is not None and _same(given, self.token) and scope["method"] == "GET":
                await _set_cookie_and_redirect(scope, send, self.token)
                return
            if not (_same(_bearer(headers), self.token) or _same(_cookie(headers), self.token)):
                await _refuse(send, 401, "this dashboard needs its token: open the address `hora dashboard` printed "
                                         "(it ends in ?token=...), or send 'Authorization: Bearer TOKEN'")
                return
        await self.app(scope, receive, _secured(send))


def _host_name(host: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8585`` -> ``::1``)."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _bearer(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization", "")
    return value[7:].strip() if value[:7].lower() == "bearer " else None


def _cookie(headers: dict[str, str]) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return None


def _secured(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), *HEADERS]
        await send(message)

    return wrapped


async def _refuse(send: Send, status: int, reason: str) -> None:
    body = json.dumps({"error": reason}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *HEADERS]})
    await send({"type": "http.response.body", "body": body})


async def _set_cookie_and_redirect(scope: Scope, send: Send, token: str) -> None:
    rest = [(k, v) for k, v in urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1")) if k != "token"]
    location = scope.get("path", "/") + ("?" + urllib.parse.urlencode(rest) if rest else "")
    cookie = f"{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"
    await send({"type": "http.response.start", "status": 303, "headers": [
        (b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode("latin-1")),
        (b"content-length", b"0"), *HEADERS]})
    await send({"type": "http.response.body", "body": b""})
