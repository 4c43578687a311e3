"""Ferry's copy engine, in-process: parallel, verified transfers between
object storage (``s3://``, ``gs://``, ``az://``; pulls from ``oci://``) and memory or local directories.

The work happens in Rust with the GIL released, so Python threads calling
in parallel run in parallel; calls with the same options share one engine
(one request budget, one connection pool). Every function has an
``*_async`` twin that asyncio can await. Options are the ``ferry-stager``
flags with underscores (``part_size="16MiB"``, ``concurrency=32`` or the default ``"auto"``,
``endpoint_url="http://minio:9000"``); credentials come from the usual
AWS or Google environment and files. A web identity token (a projected
service-account token) is exchanged at STS as the CLI does: from
``AWS_WEB_IDENTITY_TOKEN_FILE`` and ``AWS_ROLE_ARN`` (what EKS's webhook
sets), or ``web_identity_token_file=``, ``role_arn=`` and, for an
S3-compatible store's own STS, ``sts_endpoint=``.

Failures raise a subclass of :class:`FerryError` named for the reason
(``AccessDenied``, ``BucketNotFound``, ``ChecksumMismatch``, ...), with
``reason`` and ``message`` attributes. Bad arguments raise ``TypeError``
or ``ValueError`` naming the argument.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

from . import _ferry
from ._ferry import (  # noqa: F401  (re-exported)
    OPTIONS,
    AccessDenied,
    Buffer,
    BucketNotFound,
    ChecksumMismatch,
    DestinationUnusable,
    EndpointUnreachable,
    FerryError,
    InsufficientCapacity,
    InvalidConfiguration,
    NoCredentials,
    ObjectChanged,
    ObjectNotFound,
    Progress,
    QuotaExceeded,
    SourceEmpty,
    SourceUnreadable,
    StoreRejected,
    StoreUnavailable,
    TransferIncomplete,
    UnknownReason,
    __version__,
    read,
    read_async,
    read_many,
    read_many_async,
    write,
    write_async,
    write_file,
    write_file_async,
)

__all__ = [
    "__version__",
    "OPTIONS",
    "AccessDenied",
    "Buffer",
    "BucketNotFound",
    "ChecksumMismatch",
    "DestinationUnusable",
    "EndpointUnreachable",
    "FerryError",
    "InsufficientCapacity",
    "InvalidConfiguration",
    "NoCredentials",
    "ObjectChanged",
    "ObjectNotFound",
    "Progress",
    "QuotaExceeded",
    "SourceEmpty",
    "SourceUnreadable",
    "StoreRejected",
    "StoreUnavailable",
    "Summary",
    "TransferIncomplete",
    "UnknownReason",
    "pull",
    "pull_async",
    "push",
    "push_async",
    "read",
    "read_async",
    "read_many",
    "read_many_async",
    "write",
    "write_async",
    "write_file",
    "write_file_async",
]


class Summary(dict):
    """What a pull or push did: the JSON summary ``ferry-stager`` writes
    with ``--summary-file`` (objects, bytes, seconds, throughput, failures,
    snapshot, ...), as a dict whose keys are also attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _summary(summary_json: str) -> Summary:
    return Summary(json.loads(summary_json))


def _with_summary(error: TransferIncomplete) -> TransferIncomplete:
    error.summary = _summary(error.summary_json)
    return error


def pull(
    uri: str,
    directory: "os.PathLike[str] | str",
    *,
    progress: Optional[Callable[[Progress], None]] = None,
    **options: Any,
) -> Summary:
    """Copies every object under ``uri`` into ``directory``, as
    ``ferry-stager pull`` does: only what is missing or changed, each file
    verified before it appears under its final name. ``progress`` is called
    with a :class:`Progress` four times a second. Raises
    :class:`TransferIncomplete` (with ``.summary``) when some objects
    failed."""
    try:
        return _summary(_ferry.pull_json(uri, os.fspath(directory), progress, **options))
    except TransferIncomplete as error:
        raise _with_summary(error) from None


async def pull_async(
    uri: str,
    directory: "os.PathLike[str] | str",
    *,
    progress: Optional[Callable[[Progress], None]] = None,
    **options: Any,
) -> Summary:
    """:func:`pull` as a coroutine. Cancelling it stops the transfer; no
    partial file is left under a final name, and the next pull resumes."""
    try:
        return _summary(await _ferry.pull_json_async(uri, os.fspath(directory), progress, **options))
    except TransferIncomplete as error:
        raise _with_summary(error) from None


def push(
    directory: "os.PathLike[str] | str",
    uri: str,
    *,
    progress: Optional[Callable[[Progress], None]] = None,
    **options: Any,
) -> Summary:
    """Copies every file under ``directory`` to objects under ``uri``, as
    ``ferry-stager push`` does (unchanged objects are skipped, interrupted
    multipart uploads resumed). Raises :class:`TransferIncomplete` (with
    ``.summary``) when some files failed."""
    try:
        return _summary(_ferry.push_json(os.fspath(directory), uri, progress, **options))
    except TransferIncomplete as error:
        raise _with_summary(error) from None


async def push_async(
    directory: "os.PathLike[str] | str",
    uri: str,
    *,
    progress: Optional[Callable[[Progress], None]] = None,
    **options: Any,
) -> Summary:
    """:func:`push` as a coroutine."""
    try:
        return _summary(await _ferry.push_json_async(os.fspath(directory), uri, progress, **options))
    except TransferIncomplete as error:
        raise _with_summary(error) from None
