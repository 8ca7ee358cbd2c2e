"""The `hf` inference engine: SGLang's native HTTP API served from a transformers model.

Run: `python -m relax.backends.hf.server --model-path DIR [--host 127.0.0.1] [--port 30000]
[--api-key KEY] [--device cpu|cuda[:i]] [--dtype auto|float32|bfloat16] [--max-running-requests 256]
[--max-context-len L] [--served-model-name NAME] [--batch-wait-ms 20] [--num-threads N]
[--rl-on-policy-target fsdp] [--incremental-streaming-output] [--enable-lora --max-lora-rank R
[--lora-target-modules all-linear] [--lora-alpha A]] [--enable-return-routed-experts] [--log-level info]`.

Endpoints (field names as SGLang's): POST /generate (`"stream": true`: server-sent events, streaming.py;
`sampling_params.regex` / `json_schema` / `ebnf` / `structural_tag`: constrained decoding, grammar.py);
GET /health, /health_generate,
/get_model_info (/model_info), /get_weight_version, /get_server_info (/server_info: SGLang's
fields, see `server_info`); /flush_cache; POST /pause_generation,
/continue_generation, /abort_request, /init_weights_update_group,
/begin_weight_update, /update_weights_from_distributed, /update_weights_from_tensor (CUDA IPC
from a trainer on the same GPU), /end_weight_update, /destroy_weights_update_group, /update_weight_version
(weight_session.py, with Relax's /arm_weight_update: a whole push armed in one request);
/release_memory_occupation, /resume_memory_occupation; /start_profile, /stop_profile (profiler.py);
/weights_checker (checksums by HF name, weights_checker.py). See
docs/backends/hf.md.

Security (ARCHITECTURE.md §9): binds to --host (loopback by default); with --api-key every
endpoint except GET /health*, /get_*, /model_info and /server_info needs `Authorization: Bearer <key>` (constant-time
compare, 401 otherwise). Payloads are validated and rejected with 400 {"error": {"message"}};
a bad request never takes the engine down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import os
import socket
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from relax.backends.hf.engine import DTYPE_CHOICES, LOAD_FORMATS, EngineUnavailable, HFEngine
from relax.backends.hf.openai_api import add_openai_routes
from relax.backends.hf.profiler import EngineProfiler, add_profile_routes
from relax.backends.hf.streaming import generate_events
from relax.backends.hf.weight_session import add_weight_session_routes
from relax.backends.hf.weights_checker import add_weights_checker_route
from relax.backends.hf.protocol import (
    AbortRequest, GenerateRequest, GroupNameRequest, InitWeightsUpdateGroupRequest, MemoryRequest,
    PauseGenerationRequest, UpdateWeightsFromDistributedRequest, UpdateWeightsFromTensorRequest, build_output,
    normalize_generate,
)
from relax.config.lora import ALL_LINEAR, LoraSpec, parse_targets
from relax.distributed.weights.group import run_in_daemon_thread
from relax.distributed.weights.protocol import parse_specs
from relax.distributed.weights.receiver import load_format_is_flat
from relax.utils import startup_gc
from relax.utils.net import ENGINE_KEEP_ALIVE_S

logger = logging.getLogger(__name__)

API_KEY_ENV = "RELAX_HF_API_KEY"
SGLANG_API_VERSION = "0.5.23"  # the SGLang release whose HTTP API this engine follows (`version` of /server_info)
PUBLIC_INFO = ("/model_info", "/server_info")  # SGLang's newer names of /get_model_info, /get_server_info


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def is_public(method: str, path: str) -> bool:
    """Read-only probes that need no API key: GET /health*, /get_*, /model_info and /server_info."""
    return method in ("GET", "HEAD") and (path.startswith(("/health", "/get_")) or path in PUBLIC_INFO)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "invalid request: " + "; ".join(parts[:10])


def _result(success: bool, message: str) -> JSONResponse:
    """SGLang's weight-endpoint reply: 200 on success, 400 with success=false otherwise."""
    return JSONResponse({"success": success, "message": message}, status_code=200 if success else 400)


class ApiKeyCheck:
    """Pure ASGI middleware: every request but the public probes carries `Authorization: Bearer <api key>`
    (constant-time compare), else 401. (Starlette's `@app.middleware("http")` runs each request in a task
    of its own behind memory streams: ~0.3-1 ms more a call, on every push's arm and end as well.)"""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not is_public(scope["method"], scope["path"]):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                reply = error_response(401, "missing or wrong API key: send 'Authorization: Bearer <api key>'")
                return await reply(scope, receive, send)
        await self.app(scope, receive, send)


def add_security(app: FastAPI, api_key: str | None) -> None:
    if api_key:  # (no middleware at all without a key)
        app.add_middleware(ApiKeyCheck, api_key=api_key)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_request: Request, exc: RequestValidationError):
        return error_response(400, _validation_message(exc))


def add_generate_routes(app: FastAPI, engine: HFEngine, launch: dict[str, Any] | None = None) -> None:
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(req: GenerateRequest):
        start = time.perf_counter()
        try:
            items, batched = normalize_generate(req, engine.tokenizer, vocab_size=engine.vocab_size,
                                                max_context_len=engine.max_context_len)
            if req.stream:  # server-sent events (streaming.py); a bad request is still a plain 400
                events = generate_events(engine, items, await engine.prepare(items), batched=batched,
                                         incremental=bool((launch or {}).get("incremental_streaming_output")),
                                         text_in_logprobs=req.return_text_in_logprobs)
                return StreamingResponse(events, media_type="text/event-stream")
            results = await engine.generate(items)
        except ValueError as exc:
            return error_response(400, str(exc))
        except EngineUnavailable as exc:
            return error_response(503, str(exc))
        except RuntimeError as exc:
            return error_response(500, str(exc))
        latency = time.perf_counter() - start
        tokenizer = engine.tokenizer if req.return_text_in_logprobs else None
        outputs = [build_output(item, result, weight_version=result.weight_version or engine.weight_version,
                                e2e_latency=latency, tokenizer=tokenizer) for item, result in zip(items, results)]
        return outputs if batched else outputs[0]

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate():
        return Response(status_code=200 if await engine.health_generate() else 503)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def get_model_info():
        # SGLang's fields this engine has no counterpart of, at SGLang's defaults.
        return {**engine.info(), "load_format": engine.load_format, "reasoning_parser": None, "tool_call_parser": None,
                "disaggregation_mode": "null"}

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": engine.weight_version}

    throughput_mark = [time.monotonic(), 0]  # (when, generated tokens) at the last /server_info

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info():
        return server_info(engine, launch or {}, throughput_mark)


def server_info(engine: HFEngine, launch: dict[str, Any], mark: list) -> dict[str, Any]:
    """SGLang's /server_info: the ServerArgs fields this engine has (SGLang's names; tp/dp size 1,
    no API key reported), the scheduler's state, `internal_states` (one dict per data-parallel rank,
    one here; `last_gen_throughput` is tokens/s since the previous call, `load` the requests
    running or queued) and `version`; then Relax's own fields (busy_seconds, memory, weight groups)."""
    sched, context = engine.scheduler.info(), engine.max_context_len
    now, tokens = time.monotonic(), sched["generated_tokens"]
    throughput = (tokens - mark[1]) / max(now - mark[0], 1e-6)
    mark[:] = [now, tokens]
    state = {"last_gen_throughput": throughput, "load": sched["running_requests"] + sched["queued_requests"],
             "num_running_reqs": sched["running_requests"], "num_waiting_reqs": sched["queued_requests"],
             "effective_max_running_requests_per_dp": sched["max_running_requests"], "world_size": 1,
             "weight_version": engine.weight_version}
    server_args = {
        "host": launch.get("host"), "port": launch.get("port"), "random_seed": launch.get("random_seed"),
        "log_level": launch.get("log_level", "info"), "tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1,
        "context_length": context, "max_total_num_tokens": sched["max_running_requests"] * context,
        "max_req_input_len": context - 1, "skip_tokenizer_init": False, "is_embedding": False,
        "load_format": engine.load_format, "kv_cache_dtype": "auto", "page_size": 1, "trust_remote_code": False,
        "enable_memory_saver": True,  # weights and cache are released on /release_memory_occupation
        "enable_lora": engine.lora is not None, "max_lora_rank": engine.lora.rank if engine.lora else None,
    }
    return {**engine.info(), **server_args, **sched, "startup_time": launch.get("startup_time"),
            "internal_states": [state], "version": SGLANG_API_VERSION,
            "released_tags": sorted(engine.released_tags), "weight_update_groups": sorted(engine.receiver.groups),
            "weight_buckets_in_order": True,  # Relax's extension: pipelined pushes (`bucket_index`)
            "weight_buckets_flat": True,  # and one broadcast per bucket (`load_format: flat_bytes`)
            "weight_push_armed": True,  # and a whole push armed in one request (/arm_weight_update; weight_session.py)
            "weight_push_ahead": True,  # and its buckets broadcast before the arm is answered (drained if refused)
            "weights_checker_by_name": True,  # and /weights_checker checksums by HF name (weights_checker.py)
            **engine.memory_info()}


def add_control_routes(app: FastAPI, engine: HFEngine) -> None:
    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return Response(content="Cache flushed.\n", status_code=200)  # no prefix cache to flush

    @app.post("/pause_generation")
    async def pause_generation(req: PauseGenerationRequest | None = None):
        await engine.scheduler.pause((req or PauseGenerationRequest()).mode)
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        engine.scheduler.resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/abort_request")
    async def abort_request(req: AbortRequest):
        if not req.abort_all and not req.rid:
            return error_response(400, "give 'rid' or 'abort_all': true")
        engine.scheduler.abort(req.rid, abort_all=req.abort_all)
        return Response(status_code=200)

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release_memory_occupation(req: MemoryRequest | None = None):
        return {"success": True, "message": await engine.release_memory((req or MemoryRequest()).tags)}

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume_memory_occupation(req: MemoryRequest | None = None):
        return {"success": True, "message": await engine.resume_memory((req or MemoryRequest()).tags)}


@contextlib.asynccontextmanager
async def _weight_update(engine: HFEngine, abort_all_requests: bool, bucket_index: int | None = None):
    """One weight update at a time; SGLang's `abort_all_requests` ends the running requests first.
    A bucket with a `bucket_index` (a pipelined push: the sender posted several at once) waits for
    its turn, so buckets load, and their broadcasts are received, in the sender's order."""
    if bucket_index is not None:
        async with engine.bucket_turn:
            await asyncio.wait_for(engine.bucket_turn.wait_for(lambda: engine.next_bucket == bucket_index),
                                   timeout=engine.receiver.timeout_s)
    try:
        async with engine.weight_update_lock:
            if abort_all_requests:
                engine.scheduler.abort(abort_all=True, message="aborted by a weight update")
            yield
    finally:
        if bucket_index is not None:
            async with engine.bucket_turn:
                engine.next_bucket = bucket_index + 1
                engine.bucket_turn.notify_all()


def add_weight_routes(app: FastAPI, engine: HFEngine) -> None:
    """SGLang's weight-update endpoints, answered by `engine.receiver`
    (`relax.distributed.weights.receiver.WeightReceiver`; the protocol: `weights/protocol.py`)."""
    add_weight_group_routes(app, engine)
    add_weight_session_routes(app, engine, error_response)  # SGLang's session and Relax's armed push
    add_weight_update_routes(app, engine)
    add_weights_checker_route(app, engine, error_response)  # --check-weight-update-equal


def add_weight_group_routes(app: FastAPI, engine: HFEngine) -> None:
    """Join and leave broadcast groups (rank = rank_offset: this engine is one process on one device)."""
    receiver = engine.receiver

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(req: InitWeightsUpdateGroupRequest):
        try:
            message = await run_in_daemon_thread(receiver.init_group, **req.model_dump())
        except (ValueError, RuntimeError) as exc:  # RuntimeError: the rendezvous failed or timed out
            return _result(False, f"init_weights_update_group failed: {exc}")
        return _result(True, message)

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(req: GroupNameRequest | None = None):
        try:
            # In a thread: an NCCL group's shutdown waits for the sender's, and the server must
            # keep answering meanwhile.
            name = (req or GroupNameRequest()).group_name
            return _result(True, await run_in_daemon_thread(receiver.destroy_group, name))
        except ValueError as exc:
            return _result(False, str(exc))


def add_weight_update_routes(app: FastAPI, engine: HFEngine) -> None:
    """Buckets in, by broadcast or CUDA IPC, loaded under the model's step lock (no forward sees half
    a bucket). A well-formed broadcast is always received, even when a name or shape is wrong (the
    sender must not hang), then rejected whole; a malformed one is refused before any receive and
    its group quarantined."""
    receiver = engine.receiver

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(req: UpdateWeightsFromDistributedRequest):
        try:
            receiver.group(req.group_name)
        except ValueError as exc:
            return error_response(400, str(exc))
        try:
            specs = parse_specs(req.names, req.dtypes, req.shapes)
            flat = load_format_is_flat(req.load_format)
        except ValueError as exc:  # refused before receiving: the sender's bytes may be on the wire
            receiver.quarantine(req.group_name)
            return error_response(400, f"{exc} (weight update group {req.group_name!r} is now out of step: "
                                       "destroy it and init a new one)")
        async with _weight_update(engine, req.abort_all_requests, req.bucket_index):
            try:
                # A flat bucket that is not the push's last is only queued on the GPU (receiver.py).
                deferred = flat and engine.weight_session_open and req.weight_version is None and not req.flush_cache
                success, message = await run_in_daemon_thread(receiver.receive_and_load, specs, req.group_name,
                                                               flat=flat, deferred=deferred)
            except RuntimeError as exc:  # the broadcast failed (peer gone, timeout)
                success, message = False, f"receiving the broadcast failed: {exc}"
        return _result(*receiver.take_version(success, message, req.weight_version))

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(req: UpdateWeightsFromTensorRequest):
        """A sender on this GPU: open its handles and copy. Inside a session a flat bucket stays open
        until end_weight_update (every bucket of a push reuses its buffer: weights/ipc.py)."""
        if engine.device.type != "cuda":
            return error_response(400, "update_weights_from_tensor carries CUDA IPC handles; this engine runs on "
                                       f"{engine.device} (use /update_weights_from_distributed over gloo)")
        async with _weight_update(engine, req.abort_all_requests):
            try:
                success, message = await asyncio.to_thread(receiver.load_tensor_payload, req.model_dump(),
                                                           hold=engine.weight_session_open)
            except ValueError as exc:  # an unknown load_format, a malformed or unsafe payload
                return error_response(400, f"update_weights_from_tensor: {exc}")
        return _result(success, message)


def create_app(engine: HFEngine, *, api_key: str | None = None, on_started: Any = None,
               launch: dict[str, Any] | None = None) -> FastAPI:
    """The FastAPI app around `engine`; `on_started` is awaited once the scheduler runs; `launch`:
    the server's own options (host, port, random_seed, ...), reported by /server_info."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        await engine.start()
        if on_started is not None:
            asyncio.get_running_loop().create_task(on_started())
        yield
        await engine.stop()

    app = FastAPI(title="relax hf engine", lifespan=lifespan)
    add_security(app, api_key)
    add_generate_routes(app, engine, launch)
    add_control_routes(app, engine)
    add_weight_routes(app, engine)
    add_openai_routes(app, engine, error_response)
    add_profile_routes(app, EngineProfiler(engine.scheduler, engine.device.type), error_response)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Relax hf engine: SGLang's HTTP API on a transformers model")
    parser.add_argument("--model-path", required=True, help="HF checkpoint directory")
    parser.add_argument("--tokenizer-path", default=None, help="defaults to --model-path")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless the run spans nodes)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--listen-fd", type=int, default=None,
                        help="Relax extension: serve on this socket, bound to --host:--port and passed open by the "
                             "launcher (no other process can take the port between its choice and the bind)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"require 'Authorization: Bearer KEY' on state changes (default: ${API_KEY_ENV})")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:i")
    parser.add_argument("--dtype", default="auto", choices=sorted(DTYPE_CHOICES))
    parser.add_argument("--load-format", default="auto", choices=LOAD_FORMATS,
                        help="auto: the checkpoint's weights; dummy: random weights from config.json (benchmarks)")
    parser.add_argument("--max-running-requests", type=int, default=256, help="largest decode batch")
    parser.add_argument("--max-total-tokens", type=int, default=None,
                        help="KV cache token slots (rows x columns); default: what the GPU has free (80%%), "
                             "unlimited on CPU")
    parser.add_argument("--disable-cuda-graph", action="store_true", help="decode steps run eagerly on the GPU")
    parser.add_argument("--cuda-graph-max-bs", type=int, default=None,
                        help="decode steps over more rows than this run eagerly (default: every batch size)")
    parser.add_argument("--batch-wait-ms", type=float, default=20.0,
                        help="longest wait for a burst of requests to gather before a batch starts from idle "
                             "(later requests join the running batch at the next decode step)")
    parser.add_argument("--max-context-len", type=int, default=None, help="defaults to max_position_embeddings")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--random-seed", type=int, default=None, help="seed of unseeded sampling")
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--weight-sync-timeout", type=float, default=600.0, help="seconds for group ops")
    parser.add_argument("--rl-on-policy-target", default=None, choices=["fsdp"],
                        help="true on-policy: report log-probs recomputed exactly as the fsdp trainer computes them "
                             "(one unpadded row, float32; SGLang's option of the same name)")
    parser.add_argument("--incremental-streaming-output", action="store_true",
                        help="streamed /generate events carry only the new text and output_ids (SGLang's option; "
                             "default: the reply so far, as SGLang)")
    add_lora_args(parser)
    parser.add_argument("--enable-return-routed-experts", action="store_true",
                        help="MoE models: record every token's top-k experts per layer, returned on /generate with "
                             "return_routed_experts (SGLang's flag; routing replay, docs/moe.md)")
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def add_lora_args(parser: argparse.ArgumentParser) -> None:
    """LoRA adapters (SGLang's option names, plus --lora-alpha, which SGLang reads from adapter_config.json)."""
    parser.add_argument("--enable-lora", action="store_true",
                        help="LoRA adapters on the model: zero (the base model) until a weight push brings the "
                             "trainer's adapter tensors (<module>.lora_A.weight, ...; docs/lora.md)")
    parser.add_argument("--max-lora-rank", type=int, default=None, help="the adapters' rank r (with --enable-lora)")
    parser.add_argument("--lora-target-modules", nargs="+", default=[ALL_LINEAR],
                        help="modules with adapters: names (q_proj v_proj ...) or all-linear")
    parser.add_argument("--lora-alpha", type=float, default=None, help="adapter scaling alpha / r (default: r)")


def lora_from_args(args: argparse.Namespace) -> LoraSpec | None:
    """The adapters --enable-lora asks for (None without it); ValueError naming a missing or bad flag."""
    if not args.enable_lora:
        return None
    if not args.max_lora_rank or args.max_lora_rank < 1:
        raise ValueError("--enable-lora needs --max-lora-rank R (the rank of the adapters pushed to this engine)")
    targets = parse_targets(",".join(args.lora_target_modules))
    return LoraSpec(args.max_lora_rank, args.lora_alpha or float(args.max_lora_rank), targets)


async def _announce_when_bound(server: Any, host: str, port: int) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    print(f"hf engine ready on http://{host}:{port}", flush=True)


def main(argv: list[str] | None = None) -> None:
    from relax.utils.proc import die_with_parent

    die_with_parent()  # before the slow imports: a launcher that dies meanwhile takes us along
    import torch
    import uvicorn

    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    engine = HFEngine(args.model_path, device=args.device, dtype=args.dtype,
                      max_running_requests=args.max_running_requests, max_context_len=args.max_context_len,
                      served_model_name=args.served_model_name, tokenizer_path=args.tokenizer_path,
                      seed=args.random_seed, weight_sync_timeout_s=args.weight_sync_timeout,
                      batch_wait_s=args.batch_wait_ms / 1000, rl_on_policy_target=args.rl_on_policy_target,
                      load_format=args.load_format, max_total_tokens=args.max_total_tokens,
                      cuda_graphs=not args.disable_cuda_graph, cuda_graph_max_bs=args.cuda_graph_max_bs,
                      lora=lora_from_args(args), routed_experts=args.enable_return_routed_experts)
    holder: dict[str, Any] = {}
    launch = {"host": args.host, "port": args.port, "random_seed": args.random_seed, "log_level": args.log_level,
              "startup_time": time.time(), "incremental_streaming_output": args.incremental_streaming_output}
    app = create_app(engine, api_key=args.api_key, launch=launch,
                     on_started=lambda: _announce_when_bound(holder["server"], args.host, args.port))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                            timeout_keep_alive=ENGINE_KEEP_ALIVE_S)
    holder["server"] = uvicorn.Server(config)
    startup_gc.started()  # the engine's imports and model are loaded (relax/utils/startup_gc.py)
    sockets = None if args.listen_fd is None else [socket.socket(fileno=args.listen_fd)]
    holder["server"].run(sockets=sockets)


if __name__ == "__main__":
    main()
