"""The dashboard's access rules, driven through its ASGI middleware with real requests' scopes."""

from __future__ import annotations

import asyncio

import pytest

from hora.dashboard.access import COOKIE, Access, needs_token


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"inside"})


def _request(token: str | None, path: str = "/api/jobs", query: str = "", method: str = "GET",
             **headers: str) -> tuple[int, dict[str, str], bytes]:
    scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(),
             "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(Access(_app, token)(scope, receive, send))
    start = sent[0]
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, sent[1].get("body", b"")


@pytest.mark.parametrize(("bind", "needed"), [("127.0.0.1", False), ("localhost", False), ("::1", False),
                                              ("127.0.0.2", False), ("0.0.0.0", True), ("::", True),
                                              ("10.1.2.3", True), ("myhost.example", True)])
def test_a_token_is_needed_off_loopback(bind, needed):
    assert needs_token(bind) is needed


@pytest.mark.parametrize("host", ["127.0.0.1:8585", "localhost:8585", "[::1]:8585", "localhost"])
def test_without_a_token_loopback_host_names_get_in(host):
    status, headers, body = _request(None, host=host)
    assert (status, body) == (200, b"inside")
    assert headers["x-frame-options"] == "DENY" and "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("host", ["evil.example:8585", "127.0.0.1.evil.example", "", "10.0.0.5:8585"])
def test_without_a_token_other_host_names_are_refused(host):
    """A page elsewhere that rebinds its DNS name to 127.0.0.1 still sends its own name."""
    status, _, body = _request(None, host=host)
    assert status == 403 and b"loopback" in body


def test_with_a_token_every_request_carries_it():
    token = "s3cr3t-token"
    assert _request(token, host="h:1")[0] == 401
    assert _request(token, host="h:1", authorization="Bearer nope")[0] == 401
    assert _request(token, host="h:1", authorization=f"Bearer {token}")[0] == 200
    assert _request(token, host="h:1", cookie=f"other=1; {COOKIE}={token}")[0] == 200
    assert _request(token, host="h:1", cookie=f"{COOKIE}=nope")[0] == 401
    assert _request(token, host="h:1", query="token=nope")[0] == 401


def test_a_token_in_the_address_becomes_a_cookie_and_leaves_the_address():
    status, headers, _ = _request("tok", path="/jobs/a", query="token=tok&x=1", host="h:1")
    assert status == 303 and headers["location"] == "/jobs/a?x=1"
    assert headers["set-cookie"] == f"{COOKIE}=tok; HttpOnly; SameSite=Strict; Path=/"
    assert _request("tok", path="/jobs/a", query="token=tok", method="POST", host="h:1")[0] == 401
