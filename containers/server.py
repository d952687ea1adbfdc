"""The model server: one verified artifact behind HTTP, one inference at a time.

Endpoints (a contract the client and the QoE manager code against):

- ``POST /v1/infer``: an ``application/x-npy``, ``application/x-npz`` or ``application/json``
  body (see ``containers.wire``); the reply uses the same family, with headers ``X-Model-Ms``
  (inference only) and ``X-Server-Ms`` (handler entry to reply ready, queueing included).
  Errors are ``{"error": "one line"}``: 400 malformed body, 413 body too large (a JSON body
  has a much smaller limit than a binary one: parsed, it takes tens of times its size), 415
  unsupported Content-Type, 422 inputs that do not fit the model, 500 anything else.
- ``GET /health``: ``{"status": "ok", "name", "model", "batch_sizes", "threads"}``.
- ``GET /metrics``: Prometheus text (see ``ServerMetrics``).

Inference runs on one dedicated worker thread, which is the lock: requests queue for it
while the event loop keeps answering health and metrics. One thread (not a pool) also keeps
TVM's thread-local worker pool and any CUDA context on a single thread.

Run it as ``python -m containers.server ARTIFACT --port N [--host H] [--threads T]
[--max-body-bytes B] [--max-json-bytes J] [--name NAME]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from containers import wire
from containers.errors import BadPayload, InferenceRejected
from results.errors import ArtifactError, InputMismatch

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from results.inference import ArtifactModel

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# JSON bodies parsed at once: what waits holds only its body, not the tens of times more a parse takes.
JSON_DECODES = 2
JSON_ADVICE = f" for JSON; send large inputs in the binary format ({wire.NPY}, or {wire.NPZ} for several inputs)"
# 0.1 ms to about 29 s in x1.5 steps: fine enough for a QoE manager to estimate means and
# percentiles from bucket deltas at any latency a model server plausibly has.
LATENCY_BUCKETS = tuple(float(f"{1e-4 * 1.5 ** k:.3g}") for k in range(32))
OUTCOMES = ("ok", "client_error", "server_error")

logger = logging.getLogger(__name__)


class ServerMetrics:
    """The server's Prometheus series, in a registry of its own so several servers can share a process.

    ``autotune_requests_total{outcome}`` counts every ``/v1/infer`` request; the histograms
    and ``autotune_items_total`` cover successful ones, so latency statistics are those of
    served requests.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("autotune_requests", "Inference requests by outcome (ok, client_error, server_error).",
                                ["outcome"], registry=self.registry)
        self.items = Counter("autotune_items", "Batch items served by successful inference requests.",
                             registry=self.registry)
        self.request_seconds = Histogram("autotune_request_seconds", "Server time per successful inference request.",
                                         buckets=LATENCY_BUCKETS, registry=self.registry)
        self.inference_seconds = Histogram("autotune_inference_seconds", "Model time per successful inference request.",
                                           buckets=LATENCY_BUCKETS, registry=self.registry)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)

    def served(self, items: int, server_s: float, model_s: float) -> None:
        self.requests.labels("ok").inc()
        self.items.inc(items)
        self.request_seconds.observe(server_s)
        self.inference_seconds.observe(model_s)

    def failed(self, status: int) -> None:
        self.requests.labels("client_error" if status < 500 else "server_error").inc()

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def create_app(model: ArtifactModel, name: str, threads: int | None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_json_bytes: int | None = None) -> Starlette:
    """The server's ASGI app for ``model``.

    Args:
        model: the model to serve (``warm_up`` it first so the first request is not slow).
        name: what ``/health`` calls this server.
        threads: the TVM thread count it runs with, reported by ``/health`` (None: TVM's default).
        max_body_bytes: the largest request body accepted, declared or streamed.
        max_json_bytes: the largest JSON body accepted; None for ``wire.DEFAULT_MAX_JSON_BYTES`` (or
            ``max_body_bytes`` when that is smaller).
    """
    from prometheus_client import CONTENT_TYPE_LATEST
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    metrics = ServerMetrics()
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
    dtypes = [spec["dtype"] for spec in model.inputs]
    json_limit = min(max_json_bytes or wire.DEFAULT_MAX_JSON_BYTES, max_body_bytes)
    json_slots = asyncio.Semaphore(JSON_DECODES)

    def decode(media: str, body: bytes) -> list[np.ndarray]:
        if media == wire.JSON:
            return wire.decode_json_inputs(body, dtypes)
        return wire.decode_arrays(media, body, max_bytes=max_body_bytes)

    def encode(media: str, outputs: list[np.ndarray], model_ms: float) -> tuple[str, bytes]:
        if media == wire.JSON:
            return wire.JSON, wire.encode_json_outputs(outputs, model_ms)
        return wire.encode_arrays(outputs)

    def timed(arrays: list[np.ndarray]) -> tuple[list[np.ndarray], float]:
        start = time.perf_counter()
        outputs = model(arrays)
        return outputs, time.perf_counter() - start

    async def infer(request: Request) -> Response:
        start = time.perf_counter()
        try:
            media = wire.media_type(request.headers.get("content-type"))
            if media is None:
                raise InferenceRejected(f"unsupported Content-Type {request.headers.get('content-type')!r}; "
                                        f"send one of {', '.join(wire.MEDIA_TYPES)}", 415)
            if media == wire.JSON:  # parsed, it takes tens of times its size: a smaller limit, few parses at once
                body = await _read_body(request, json_limit, "JSON body", JSON_ADVICE)
                async with json_slots:
                    arrays = await run_in_threadpool(decode, media, body)
            else:
                arrays = await run_in_threadpool(decode, media, await _read_body(request, max_body_bytes))
            items = model.check(arrays)
            outputs, model_s = await asyncio.get_running_loop().run_in_executor(worker, timed, arrays)
            reply_media, content = await run_in_threadpool(encode, media, outputs, model_s * 1e3)
        except Exception as err:  # every failure becomes a JSON reply; the server keeps serving
            status, message = _failure(err)
            metrics.failed(status)
            return JSONResponse({"error": message}, status,
                                headers={"X-Server-Ms": f"{(time.perf_counter() - start) * 1e3:.4f}"})
        server_s = time.perf_counter() - start
        metrics.served(items, server_s, model_s)
        return Response(content, media_type=reply_media,
                        headers={"X-Model-Ms": f"{model_s * 1e3:.4f}", "X-Server-Ms": f"{server_s * 1e3:.4f}"})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "name": name, "model": model.artifact.manifest["model"],
                             "batch_sizes": model.batch_sizes, "threads": threads})

    async def prometheus(request: Request) -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        worker.shutdown(wait=False, cancel_futures=True)

    return Starlette(routes=[Route("/v1/infer", infer, methods=["POST"]), Route("/health", health),
                             Route("/metrics", prometheus)], lifespan=lifespan)


async def _read_body(request: Request, limit: int, what: str = "body", advice: str = "") -> bytes:
    """The request body, refused with 413 as soon as it is known to pass ``limit`` bytes.

    The declared Content-Length is checked first; a chunked (or lying) body is counted as it
    streams, so the server never holds more than ``limit`` bytes of it. The 413 line names the
    body as ``what`` and ends with ``advice``.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InferenceRejected(f"Content-Length {declared!r} is not a byte count", 400)
        if int(declared) > limit:
            raise InferenceRejected(f"{what} of {declared} bytes is over this server's {limit}-byte limit{advice}",
                                    413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InferenceRejected(f"{what} is over this server's {limit}-byte limit{advice}", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _failure(err: Exception) -> tuple[int, str]:
    """The HTTP status and one-line message for a failed inference request."""
    from starlette.requests import ClientDisconnect

    if isinstance(err, InferenceRejected):
        return err.status, str(err)
    if isinstance(err, BadPayload):
        return 400, str(err)
    if isinstance(err, InputMismatch):
        return 422, str(err)
    if isinstance(err, ClientDisconnect):
        return 400, "the client disconnected before sending the whole body"
    logger.exception("inference failed")
    lines = str(err).strip().splitlines()
    return 500, f"inference failed: {type(err).__name__}: {lines[0] if lines else 'no message'}"


def serve(model: ArtifactModel, name: str, port: int, host: str = "127.0.0.1", threads: int | None = None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_json_bytes: int | None = None) -> None:
    """Serve ``model`` with uvicorn until interrupted (access log off: metrics count requests)."""
    import uvicorn

    uvicorn.run(create_app(model, name, threads, max_body_bytes, max_json_bytes), host=host, port=port,
                access_log=False)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def load_model(artifact: str | Path) -> ArtifactModel:
    """The artifact (hashes checked, and the model and target it describes: ``ArtifactModel``), on a TVM
    loaded as a server needs it, warmed up.

    Raises:
        ArtifactError: not an artifact, altered, or a manifest without what a server reads of it.
    """
    from results.artifact import open_artifact
    from results.inference import ArtifactModel

    model = ArtifactModel(open_artifact(artifact))
    _lean_runtime(model.artifact.manifest["target"]["kind"])
    model.warm_up()
    return model


def _lean_runtime(target_kind: str) -> None:
    """Load TVM in this process as a model server needs it, before anything imports it.

    ``import tvm`` brings PyTorch along (tvm_ffi imports it whenever it is installed, for
    DLPack interop a server never uses) and maps the 260 MB compiler library. Without
    both a replica in a container answered 1.2 s after its start on a whole core instead
    of 2.6 s (2.3 instead of 5.4 s on half a core) and held 136 MB instead of 437 MB: what
    a Tuner adding replicas under a traffic spike waits for, and what a host packing
    replicas runs out of. The runtime library alone has no CUDA device API (TVM loads its
    backends with the compiler), so CUDA artifacts keep it.
    """
    if "tvm" in sys.modules:
        return
    # None in sys.modules makes ``import torch`` an ImportError, which tvm_ffi reads as "not installed"
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    if target_kind != "cuda":
        os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")


def main(argv: Sequence[str] | None = None) -> int:
    """Open and warm up the artifact, then serve it; 2 with one ``error:`` line if the artifact is bad."""
    parser = argparse.ArgumentParser(prog="python -m containers.server",
                                     description="Serve one autotune artifact over HTTP.")
    parser.add_argument("artifact", help="artifact folder (or the run folder holding it)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--threads", type=_positive_int, help="TVM threads (sets TVM_NUM_THREADS before TVM loads)")
    parser.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--max-json-bytes", type=_positive_int,
                        help=f"largest JSON body (default {wire.DEFAULT_MAX_JSON_BYTES}, at most --max-body-bytes)")
    parser.add_argument("--name", help="name reported by /health (default: the model spec)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)
    env_threads = os.environ.get("TVM_NUM_THREADS", "")
    try:
        model = load_model(args.artifact)
    except ArtifactError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    name = args.name or str(model.artifact.manifest["model"].get("spec", model.artifact.path.name))
    serve(model, name, args.port, args.host, int(env_threads) if env_threads.isdigit() else None, args.max_body_bytes,
          args.max_json_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
