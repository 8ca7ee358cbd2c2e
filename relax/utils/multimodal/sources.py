"""Where a media item's bytes come from: the forms a data row may hold.

The seed's data format says multimodal data "supports local file paths, URLs, and binary
files". One item may be:

- raw `bytes` (parquet columns written from HF datasets, converted verl rows);
- an HF datasets-style struct `{"bytes": ..., "path": ...}` (bytes win when both are set);
- a `data:<mime>;base64,<payload>` URI (qwen-vl-utils' inline form);
- an `http://` / `https://` URL, fetched with a timeout (`MediaError` naming the URL when it
  cannot be reached: the machine may have no network, which is common on training clusters);
- a `file://` URL or a local path (`~` expanded).

Every failure is a `MediaError` (a `ValueError`) whose message names the item, so the data
loader can turn it into a per-row error naming the row, the column and the file.
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.error
import urllib.request
from typing import Any

URL_TIMEOUT_S = 10.0
_MAX_URL_BYTES = 512 * 1024 * 1024  # a bound on one fetched item, so a bad URL cannot fill memory


class MediaError(ValueError):
    """A media item that cannot be read or decoded; the message names the item."""


def describe(item: Any) -> str:
    """A short, log-safe name for an item (inline payloads are not printed)."""
    if isinstance(item, str):
        return repr(item[:40] + "...") if item.startswith("data:") else repr(item)
    if isinstance(item, dict) and item.get("path"):
        return repr(item["path"])
    if isinstance(item, (bytes, bytearray)):
        return f"<{len(item)} inline bytes>"
    return f"<{type(item).__name__}>"


def read_bytes(item: Any, kind: str = "media", *, timeout: float = URL_TIMEOUT_S) -> bytes:
    """The raw bytes of one media item (see the module docstring for the accepted forms)."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, dict):
        if item.get("bytes") is not None:
            return bytes(item["bytes"])
        if item.get("path"):
            return read_bytes(item["path"], kind, timeout=timeout)
        raise MediaError(f"{kind}: a {{'bytes', 'path'}} mapping with neither set")
    if not isinstance(item, str):
        raise MediaError(f"{kind}: expected a path, URL, data: URI, bytes or a {{'bytes', 'path'}} mapping, "
                         f"got {type(item).__name__}")
    if item.startswith("data:"):
        return _decode_data_uri(item, kind)
    if item.startswith(("http://", "https://")):
        return _fetch_url(item, kind, timeout)
    path = item[len("file://"):] if item.startswith("file://") else item
    if "://" in path:
        raise MediaError(f"{kind} {item!r}: unsupported URL scheme; use a local path, file://, http(s):// or data:")
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return f.read()
    except OSError as exc:
        raise MediaError(f"{kind} {item!r}: cannot read ({exc.strerror})") from exc


def _decode_data_uri(uri: str, kind: str) -> bytes:
    header, sep, payload = uri.partition(",")
    if not sep or not header.endswith(";base64"):
        raise MediaError(f"{kind} {describe(uri)}: only base64 data: URIs are supported "
                         "('data:<mime>;base64,<payload>')")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"{kind} {describe(uri)}: invalid base64 payload ({exc})") from exc


def _fetch_url(url: str, kind: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (http(s) only, checked above)
            data = response.read(_MAX_URL_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = f"HTTP {exc.code} {exc.reason}" if isinstance(exc, urllib.error.HTTPError) else \
            getattr(exc, "reason", exc)
        raise MediaError(f"{kind} {url!r}: cannot fetch ({reason}; timeout {timeout:g} s); check the URL and the "
                         "network, or download the files and store local paths") from exc
    if len(data) > _MAX_URL_BYTES:
        raise MediaError(f"{kind} {url!r}: larger than {_MAX_URL_BYTES} bytes")
    return data
