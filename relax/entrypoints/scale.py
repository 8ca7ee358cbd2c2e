"""`relax-scale`: the scaling REST API of a running run, from the shell (docs/elastic-scaling.md).

    relax-scale --exp-dir DIR status            JSON: api (base URL), engines (id, address, state, protected), ...
    relax-scale --exp-dir DIR up N              add N engines (ray_native)
    relax-scale --exp-dir DIR down N            drain and remove N engines (the newest unprotected ones)
    relax-scale --exp-dir DIR register ADDR...  add running engines at host:port (external)
    relax-scale --exp-dir DIR release ID...     drain and release engines by id or address
    relax-scale --exp-dir DIR cancel OP         cancel an operation, rolling the fleet back
    relax-scale --exp-dir DIR operation OP      an operation's status and events

The API is served by the run's Rollout role (`relax.engine.elastic.service`), which writes its address
and token to the run directory, where this reads them (`relax.engine.elastic.discovery`); the token never
appears in argv. On several nodes, run it on the Rollout replica's node (the API binds loopback unless
--scale-api-host says otherwise). `--wait` follows an operation until it ends (exit 1 unless it succeeded).
A refused request prints the API's message on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx

from relax.engine.elastic.discovery import find, unreachable

FINAL = ("succeeded", "partial", "failed", "cancelled")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relax-scale", description="Scale a running run's rollout engines.")
    p.add_argument("--exp-dir", required=True, help="the run's --exp-dir")
    p.add_argument("--wait", action="store_true", help="follow the operation until it ends")
    p.add_argument("--key", default=None, help="idempotency key: repeating the command with it does one thing")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="the fleet, as JSON")
    for name, what in (("up", "engines to add"), ("down", "engines to remove")):
        sub.add_parser(name, help=what).add_argument("n", type=int, help=what)
    sub.add_parser("register", help="external engines to add").add_argument("addresses", nargs="+")
    sub.add_parser("release", help="engines to remove, by id or address").add_argument("engines", nargs="+")
    sub.add_parser("cancel", help="cancel an operation").add_argument("op")
    sub.add_parser("operation", help="an operation's status").add_argument("op")
    return p


def request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """(method, path, body) of the command."""
    key = {"idempotency_key": args.key} if args.key else {}
    return {
        "status": lambda: ("GET", "/fleet", None),
        "up": lambda: ("POST", "/scale_out", {"num_engines": args.n, **key}),
        "down": lambda: ("POST", "/scale_in", {"num_engines": args.n, **key}),
        "register": lambda: ("POST", "/scale_out", {"addresses": args.addresses, **key}),
        "release": lambda: ("POST", "/scale_in", {"engines": args.engines, **key}),
        "cancel": lambda: ("POST", f"/operations/{args.op}/cancel", None),
        "operation": lambda: ("GET", f"/operations/{args.op}", None),
    }[args.command]()


class ApiRefused(Exception):
    pass


def call(client: httpx.Client, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
    resp = client.request(method, path, json=body)
    try:
        data = resp.json()
    except ValueError:
        data = {"error": resp.text[:500]}
    if resp.status_code >= 400:
        raise ApiRefused(f"HTTP {resp.status_code}: {data.get('error', data)}")
    return data


def follow(client: httpx.Client, op: dict[str, Any]) -> dict[str, Any]:
    """Poll the operation until it ends."""
    while op["status"] not in FINAL:
        time.sleep(0.5)
        op = call(client, "GET", f"/operations/{op['id']}", None)["operation"]
    return op


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        url, token = find(args.exp_dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"relax-scale: {exc}", file=sys.stderr)
        return 1
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=args.timeout, trust_env=False) as client:
        try:
            result = call(client, *request(args))
            if args.wait and "operation" in result:
                result["operation"] = follow(client, result["operation"])
        except httpx.ConnectError:
            print(f"relax-scale: {args.command}: {unreachable(args.exp_dir, url)}", file=sys.stderr)
            return 1
        except (ApiRefused, httpx.HTTPError) as exc:
            print(f"relax-scale: {args.command}: {exc}", file=sys.stderr)
            return 1
    if args.command == "status":
        result = {"api": result["api"], "engines": [
            {k: e[k] for k in ("id", "address", "state", "protected")} for e in result["engines"]],
            **{k: v for k, v in result.items() if k not in ("api", "engines")}}
    print(json.dumps(result, indent=2))
    op = result.get("operation")
    return 1 if args.wait and op is not None and op["status"] != "succeeded" else 0


if __name__ == "__main__":
    sys.exit(main())
