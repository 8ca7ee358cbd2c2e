"""The scaling REST API over a scaler of in-process engines: every request needs the token; malformed,
oversized, out-of-range, unknown and concurrent requests are refused with the right status and a message
(never a traceback); an operation is followed and cancelled over HTTP; `relax-scale` finds the API and
token in the run directory and prints the fleet as JSON."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading

import httpx
import pytest
from elastic_fakes import Behaviour, install, started_fleet

from relax.engine.elastic import discovery
from relax.engine.elastic.api import ScalingApi
from relax.engine.elastic.local_ops import LocalFleetOps
from relax.engine.elastic.scaler import FleetScaler, ScalerSettings
from relax.entrypoints import scale
from relax.utils.http_utils import close_sessions


@pytest.fixture()
def env(monkeypatch, tmp_path):
    return install(monkeypatch, tmp_path)


def serve_api(pool, spec, tmp_path, check):
    """Run `check(client, api, fleet)` against an API over a one-engine fleet (one slow engine queued)."""
    async def main():
        fleet = await started_fleet(pool, spec, [0])
        gate = threading.Event()
        await pool.serve(Behaviour("slow", slow_start=gate))
        token = discovery.new_token(str(tmp_path))
        api = ScalingApi(FleetScaler(LocalFleetOps(fleet), ScalerSettings()), token)
        await api.start()
        discovery.publish(str(tmp_path), api.url)
        try:
            async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {token}"},
                                         trust_env=False) as client:
                return await check(client, api, fleet, gate)
        finally:
            gate.set()
            await api.stop()
            await fleet.stop()
            await close_sessions()
            await pool.close()
    return asyncio.run(main())


def test_requests_without_the_token_are_refused_reads_included(env, tmp_path):
    pool, spec = env

    async def check(client, api, fleet, gate):
        answers = []
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
            for method, path in (("GET", "/fleet"), ("POST", "/scale_out"), ("GET", "/nope")):
                resp = await httpx.AsyncClient(trust_env=False).request(method, api.url + path, headers=headers,
                                                                         json={"num_engines": 1})
                answers.append((resp.status_code, resp.json()["error"]))
        return answers, api.host

    answers, host = serve_api(*env, tmp_path, check)
    assert {status for status, _ in answers} == {401} and host == "127.0.0.1"
    assert "Authorization: Bearer" in answers[0][1] and "wrong token" in answers[3][1]


BAD = [
    ("POST", "/scale_out", b"{not json", 400, "not valid JSON"),
    ("POST", "/scale_out", json.dumps([1]).encode(), 400, "must be a JSON object"),
    ("POST", "/scale_out", json.dumps({"num_engines": "2"}).encode(), 400, "num_engines: must be an integer"),
    ("POST", "/scale_out", json.dumps({"num_engines": True}).encode(), 400, "must be an integer"),
    ("POST", "/scale_out", json.dumps({"num_engines": 0}).encode(), 400, "between 1 and 64"),
    ("POST", "/scale_out", json.dumps({"num_engines": 10_000}).encode(), 400, "between 1 and 64"),
    ("POST", "/scale_out", json.dumps({"num_engines": 60}).encode(), 400, "room for"),
    ("POST", "/scale_out", json.dumps({"num_engines": 1, "addresses": ["a:1"]}).encode(), 400, "exactly one of"),
    ("POST", "/scale_out", json.dumps({"num_engines": 1, "extra": 1}).encode(), 400, "unknown field(s) ['extra']"),
    ("POST", "/scale_out", json.dumps({"addresses": ["10.0.0.1"]}).encode(), 400, "needs a port"),
    ("POST", "/scale_out", json.dumps({"addresses": ["0.0.0.0:80"]}).encode(), 400, "not an address"),
    ("POST", "/scale_out", json.dumps({"addresses": ["https://h:1"]}).encode(), 400, "no https"),
    ("POST", "/scale_out", json.dumps({"addresses": ["bad host!:1"]}).encode(), 400, "neither an IP"),
    ("POST", "/scale_out", json.dumps({"num_engines": 1, "idempotency_key": "a b"}).encode(), 400, "letters"),
    ("POST", "/scale_out", b"x" * (70 << 10), 413, "at most 65536"),
    ("POST", "/scale_in", json.dumps({"num_engines": 1}).encode(), 409, "protected"),
    ("POST", "/scale_in", json.dumps({"engines": ["engine-0"]}).encode(), 409, "protected"),
    ("POST", "/scale_in", json.dumps({"engines": ["engine-7"]}).encode(), 404, "no engine ['engine-7']"),
    ("GET", "/operations/op-99", None, 404, "no operation 'op-99'"),
    ("POST", "/operations/op-99/cancel", None, 404, "no operation"),
    ("GET", "/scale_out", None, 405, "not allowed"),
]


def test_bad_requests_are_refused_with_their_status_and_reason(env, tmp_path):
    async def check(client, api, fleet, gate):
        out = []
        for method, path, body, _, _ in BAD:
            resp = await client.request(method, path, content=body, headers={"Content-Type": "application/json"})
            out.append((resp.status_code, resp.json()))
        return out

    answers = serve_api(*env, tmp_path, check)
    for (method, path, _, status, words), (got, body) in zip(BAD, answers):
        assert got == status and words in body["error"], (method, path, got, body)
        assert "Traceback" not in body["error"]


def test_an_operation_over_http_exclusive_idempotent_and_cancelled(env, tmp_path):
    async def check(client, api, fleet, gate):
        first = await client.post("/scale_out", json={"num_engines": 1}, headers={"Idempotency-Key": "grow-1"})
        op = first.json()["operation"]
        repeat = await client.post("/scale_out", json={"num_engines": 1, "idempotency_key": "grow-1"})
        busy = await client.post("/scale_in", json={"num_engines": 1})
        cancel = await client.post(f"/operations/{op['id']}/cancel")
        while (await client.get(f"/operations/{op['id']}")).json()["operation"]["status"] == "running":
            await asyncio.sleep(0.02)
        final = (await client.get(f"/operations/{op['id']}")).json()["operation"]
        return first.status_code, repeat, busy, cancel.status_code, final, (await client.get("/fleet")).json()

    status, repeat, busy, cancelled, final, fleet = serve_api(*env, tmp_path, check)
    assert status == 202 and repeat.status_code == 200 and repeat.json()["operation"]["id"] == final["id"]
    assert busy.status_code == 409 and busy.json()["running_operation"] == final["id"]
    assert cancelled == 202 and final["status"] == "cancelled" and final["events"][-1]["message"].startswith("cancel")
    assert [e["id"] for e in fleet["engines"]] == ["engine-0"] and fleet["operations"][0]["status"] == "cancelled"


def test_relax_scale_finds_the_api_in_the_run_directory(env, tmp_path, capsys):
    async def check(client, api, fleet, gate):
        code = await asyncio.to_thread(scale.main, ["--exp-dir", str(tmp_path), "status"])
        refused = await asyncio.to_thread(scale.main, ["--exp-dir", str(tmp_path), "down", "1"])
        return code, refused

    code, refused = serve_api(*env, tmp_path, check)
    out, err = capsys.readouterr()
    status = json.loads(out)
    assert code == 0 and status["api"].startswith("http://127.0.0.1:")
    assert status["engines"] == [{"id": "engine-0", "address": status["engines"][0]["address"], "state": "active",
                                  "protected": True}]
    assert refused == 1 and "HTTP 409" in err and "protected" in err
    token_file = tmp_path / ".relax" / discovery.TOKEN_FILE
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600 and token_file.read_text() not in out + err
