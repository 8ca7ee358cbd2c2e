"""The scaling API's request bodies, validated at the boundary (pure functions; `ScalingError` 400 naming
the field, what was wrong and what is allowed). A body is a JSON object of known keys only:

    POST /scale_out   exactly one of  num_engines: int 1..MAX_STEP        (ray_native: add that many)
                                      target_engines: int 1..MAX_ENGINES  (ray_native: grow to that many)
                                      addresses: ["host:port", ...]       (external: register these)
    POST /scale_in    exactly one of  num_engines / target_engines        (remove that many / down to)
                                      engines: ["engine-3" | address, ...] (remove these)
    both              idempotency_key: str (or the Idempotency-Key header; both must then agree)
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from relax.engine.elastic.operations import ScalingError

MAX_BODY_BYTES = 64 << 10
MAX_STEP = 64  # engines one operation may add or remove
MAX_ENGINES = 1024
MAX_ADDRESSES = 64
_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                   r"[A-Za-z0-9])?)*$")


def bad(field: str, message: str) -> ScalingError:
    return ScalingError(400, f"{field}: {message}", field=field)


def _count(body: dict[str, Any], field: str, most: int) -> int:
    value = body[field]
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(field, f"must be an integer, got {type(value).__name__} {value!r}")
    if not 1 <= value <= most:
        raise bad(field, f"must be between 1 and {most}, got {value}")
    return value


def address(value: Any, field: str = "addresses") -> str:
    """`host:port` or `http://host:port` (an IP address or a host name; IPv6 in brackets) -> its URL."""
    if not isinstance(value, str) or len(value) > 300:
        raise bad(field, f"each address must be a string 'host:port', got {value!r}"[:400])
    text = value.strip().removeprefix("http://").rstrip("/")
    if value.strip().startswith("https://") or "/" in text or "@" in text:
        raise bad(field, f"{value!r}: give host:port or http://host:port (SGLang's HTTP API, no path, no https)")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise bad(field, f"{value!r}: needs a port between 1 and 65535, as host:port")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        if not _HOST.match(bare):
            raise bad(field, f"{value!r}: {host!r} is neither an IP address nor a host name") from None
        return f"http://{bare}:{int(port)}"
    if ip.is_unspecified or ip.is_multicast:
        raise bad(field, f"{value!r}: {bare} is not an address an engine can be reached at")
    return f"http://[{ip}]:{int(port)}" if ip.version == 6 else f"http://{ip}:{int(port)}"


def _one_of(body: Any, allowed: tuple[str, ...], endpoint: str) -> str:
    if not isinstance(body, dict):
        raise bad("body", f"must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed) - {"idempotency_key"})
    if unknown:
        raise bad("body", f"unknown field(s) {unknown} for {endpoint}; allowed: {list(allowed)} and idempotency_key")
    given = [k for k in allowed if k in body]
    if len(given) != 1:
        raise bad("body", f"{endpoint} takes exactly one of {list(allowed)}, got {given or 'none'}")
    return given[0]


def idempotency_key(body: dict[str, Any], header: str | None) -> str | None:
    value = body.get("idempotency_key", header)
    if value is None:
        return None
    if not isinstance(value, str) or not _KEY.match(value):
        raise bad("idempotency_key", "must be 1-128 characters of letters, digits and . _ : -")
    if header is not None and header != value:
        raise bad("idempotency_key", "the body's idempotency_key and the Idempotency-Key header differ")
    return value


def scale_out_request(body: Any) -> dict[str, Any]:
    """The validated request of POST /scale_out (module doc)."""
    field = _one_of(body, ("num_engines", "target_engines", "addresses"), "POST /scale_out")
    if field == "addresses":
        return {"addresses": _addresses(body["addresses"])}
    return {field: _count(body, field, MAX_STEP if field == "num_engines" else MAX_ENGINES)}


def _addresses(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise bad("addresses", f"must be a non-empty list of 'host:port' strings, got {value!r}"[:300])
    if len(value) > MAX_ADDRESSES:
        raise bad("addresses", f"at most {MAX_ADDRESSES} per request, got {len(value)}")
    urls = [address(v) for v in value]
    if len(set(urls)) != len(urls):
        raise bad("addresses", f"an address is given twice: {value}")
    return urls


def scale_in_request(body: Any) -> dict[str, Any]:
    """The validated request of POST /scale_in (module doc)."""
    field = _one_of(body, ("num_engines", "target_engines", "engines"), "POST /scale_in")
    if field != "engines":
        return {field: _count(body, field, MAX_STEP if field == "num_engines" else MAX_ENGINES)}
    names = body["engines"]
    if not isinstance(names, list) or not names or len(names) > MAX_STEP:
        raise bad("engines", f"must be a list of 1 to {MAX_STEP} engine ids or addresses (GET /fleet)")
    if not all(isinstance(n, str) and 0 < len(n) <= 300 for n in names):
        raise bad("engines", "each must be an engine id ('engine-3') or address string")
    return {"engines": [address(n, "engines") if ":" in n else n for n in names]}
