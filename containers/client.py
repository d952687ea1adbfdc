"""A client for the model server (``containers.server``), for load generators and the QoE manager."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import requests

from containers import wire
from containers.errors import ContainerError, InferenceRejected


@dataclass(frozen=True)
class InferenceReply:
    """One inference's outputs and where its time went.

    ``client_ms`` spans the HTTP exchange only (not encoding the request or decoding the
    reply), so ``client_ms - server_ms`` is the network and HTTP overhead.
    """

    outputs: list[np.ndarray]
    model_ms: float
    server_ms: float
    client_ms: float


class InferenceClient:
    """Talks to one model server over a kept-alive ``requests.Session``.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        timeout_s: the most one request may take, connecting and reading.
    """

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = requests.Session()

    def infer(self, arrays: list[np.ndarray]) -> InferenceReply:
        """Run the model on ``arrays`` (one per model input), sent as npy for one and npz for several.

        Raises:
            InferenceRejected: the server answered with an error (its line and status).
            ContainerError: the server could not be reached or sent a reply that is not npy/npz.
        """
        media, body = wire.encode_arrays(arrays)
        start = time.perf_counter()
        reply = self._request("POST", "/v1/infer", data=body, headers={"Content-Type": media})
        client_ms = (time.perf_counter() - start) * 1e3
        reply_media = wire.media_type(reply.headers.get("Content-Type"))
        if reply_media not in (wire.NPY, wire.NPZ):
            raise ContainerError(f"{self.url}/v1/infer replied with Content-Type {reply.headers.get('Content-Type')!r}; "
                                 f"expected {wire.NPY} or {wire.NPZ}")
        return InferenceReply(wire.decode_arrays(reply_media, reply.content), float(reply.headers["X-Model-Ms"]),
                              float(reply.headers["X-Server-Ms"]), client_ms)

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` document: name, model spec, batch sizes, threads."""
        return self._request("GET", "/health").json()

    def metrics_text(self) -> str:
        """The server's ``/metrics`` page in Prometheus text format."""
        return self._request("GET", "/metrics").text

    def close(self) -> None:
        self._session.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One request, with failures to connect and non-2xx replies raised as ``ContainerError``."""
        try:
            reply = self._session.request(method, self.url + path, timeout=self.timeout_s, **kwargs)
        except requests.RequestException as err:
            raise ContainerError(f"cannot reach the model server at {self.url}: {err}") from None
        if not reply.ok:
            try:
                line = reply.json()["error"]
            except (ValueError, KeyError, TypeError):
                line = reply.text.strip()[:200] or reply.reason
            raise InferenceRejected(f"{method} {path} failed with {reply.status_code}: {line}", reply.status_code)
        return reply
