"""Amazon S3 (and S3-compatible stores) for job channels and artifacts.

boto3 is imported only when an ``s3://`` URI is used (it is in the ``jobs`` extra). Credentials come from boto3's
usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an instance role ...); hora never
puts them on a command line. The endpoint, for MinIO, Ceph, a moto server or another S3-compatible store, is, in
order: the explicit argument (the job spec's field), ``HORA_S3_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``,
``AWS_ENDPOINT_URL``, else AWS itself. With a custom endpoint, path-style addressing is used (what those stores
expect).

Every botocore failure leaves this module as a :class:`hora.errors.StorageError` whose message says what was being
done and how to fix it (no credentials, refused credentials, missing bucket, unreachable endpoint).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hora.config.variables import read
from hora.errors import ConfigError, StorageError

__all__ = [
    "ENDPOINT_ENV",
    "S3Object",
    "S3Stream",
    "S3Uri",
    "download",
    "is_s3_uri",
    "list_objects",
    "make_client",
    "open_object",
    "resolve_endpoint_url",
    "translate_errors",
    "upload_file",
]

ENDPOINT_ENV = ("HORA_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AccessDenied",
    "AllAccessDisabled",
    "403",
}


def is_s3_uri(source: object) -> bool:
    return isinstance(source, str) and source.startswith("s3://")


@dataclass(frozen=True)
class S3Uri:
    """``s3://bucket/prefix``; the prefix may be empty, a "directory" (ending in ``/``) or a key."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> S3Uri:
        if not is_s3_uri(uri):
            raise ConfigError(f"{uri!r} is not an S3 URI; write s3://bucket/prefix")
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        if not bucket:
            raise ConfigError(f"S3 URI {uri!r} has no bucket; write s3://bucket/prefix")
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def child(self, name: str) -> S3Uri:
        """The URI of ``name`` inside this prefix, taken as a directory."""
        base = self.prefix.rstrip("/")
        return S3Uri(self.bucket, f"{base}/{name}" if base else name)


@dataclass(frozen=True)
class S3Object:
    key: str
    size: int


def resolve_endpoint_url(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit
    for name in ENDPOINT_ENV:
        value = read(name)
        if value:
            return value
    return None


def make_client(endpoint_url: str | None = None) -> Any:
    """An S3 client with time-outs on every call, for ``endpoint_url`` or the endpoint the environment names."""
    try:
        import boto3
        from botocore.config import Config as BotoConfig
    except ImportError:
        raise ConfigError(
            "s3:// channels and artifacts need boto3: pip install -c constraints.txt -e '.[jobs]' in hora's checkout"
        ) from None
    endpoint = resolve_endpoint_url(endpoint_url)
    config = BotoConfig(
        connect_timeout=10,
        read_timeout=60,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint else None,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint, config=config)


def _endpoint_of(client: Any) -> str:
    return str(getattr(getattr(client, "meta", None), "endpoint_url", "the S3 endpoint"))


@contextlib.contextmanager
def translate_errors(what: str, client: Any = None) -> Iterator[None]:
    """Turns boto3's and botocore's exceptions inside the block into a StorageError that starts with ``what``."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise _explain(exc, what, client) from exc
    except Boto3Error as exc:
        # boto3's transfer manager wraps the ClientError (S3UploadFailedError): explain the cause.
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, (BotoCoreError, ClientError)):
            raise _explain(cause, what, client) from exc
        raise StorageError(f"{what}: {exc}") from exc


def _explain(exc: BaseException, what: str, client: Any) -> StorageError:
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
    )

    endpoint = _endpoint_of(client) if client is not None else "the S3 endpoint"
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StorageError(
            f"{what}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "AWS_PROFILE, in the environment hora runs in"
        )
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return StorageError(
            f"{what}: cannot reach {endpoint} ({exc}); check the endpoint (s3_endpoint_url in the spec, "
            f"or {', '.join(ENDPOINT_ENV)}) and the network"
        )
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "?"))
        message = error.get("Message") or str(exc)
        if code in _CREDENTIAL_CODES:
            return StorageError(
                f"{what}: {endpoint} refused the request ({code}: {message}); check the credentials "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and their permissions"
            )
        if code in ("NoSuchBucket", "NoSuchKey", "404"):
            return StorageError(f"{what}: not found at {endpoint} ({code}: {message})")
        return StorageError(f"{what}: S3 error {code}: {message}")
    return StorageError(f"{what}: {type(exc).__name__}: {exc}")


def list_objects(client: Any, uri: S3Uri) -> list[S3Object]:
    """Every object under ``uri``'s prefix, sorted by key; "directory" marker keys (ending in ``/``) are skipped."""
    found: list[S3Object] = []
    with translate_errors(f"listing {uri}", client):
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=uri.bucket, Prefix=uri.prefix):
            for item in page.get("Contents", ()):
                if not item["Key"].endswith("/"):
                    found.append(S3Object(item["Key"], int(item["Size"])))
    found.sort(key=lambda o: o.key)
    return found


def download(
    client: Any, bucket: str, key: str, path: str, callback: Callable[[int], None] | None = None
) -> None:
    """Downloads one object to ``path`` (in parallel ranges when large); ``callback(n)`` gets bytes as they land."""
    with translate_errors(f"downloading s3://{bucket}/{key}", client):
        client.download_file(bucket, key, path, Callback=callback)


class S3Stream:
    """One object's bytes as they arrive (``read(n)``, ``close()``), for Pipe mode; errors become StorageError."""

    def __init__(self, client: Any, bucket: str, key: str) -> None:
        self._client = client
        self._what = f"reading s3://{bucket}/{key}"
        with translate_errors(self._what, client):
            self._body = client.get_object(Bucket=bucket, Key=key)["Body"]

    def read(self, n: int) -> bytes:
        with translate_errors(self._what, self._client):
            return bytes(self._body.read(n))

    def close(self) -> None:
        self._body.close()


def open_object(client: Any, bucket: str, key: str) -> S3Stream:
    return S3Stream(client, bucket, key)


def upload_file(client: Any, path: str, uri: S3Uri, callback: Callable[[int], None] | None = None) -> None:
    with translate_errors(f"uploading {path} to {uri}", client):
        client.upload_file(path, uri.bucket, uri.prefix, Callback=callback)
