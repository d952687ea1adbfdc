"""The QoE Analyst's client interface: a small HTTP API on 127.0.0.1 and a status file beside the run.

``GET /status`` returns the performance table; ``PUT /targets/{name}`` with ``{"target_ms": N}``
sets or changes a target; ``DELETE /targets/{name}`` removes it. The status file
(``status.json``) is rewritten after every iteration so ``autotune qoe status`` works
without a connection, and says where the API listens.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from containers.backends.base import reply_object
from containers.errors import ContainerError, ScenarioError, UnknownContainer
from containers.qoe.analyst import QoeAnalyst
from results.atomic import write_atomically

STATUS_FILE = "status.json"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ControlServer:
    """Serves the API in a background thread until ``stop``."""

    def __init__(self, analyst: QoeAnalyst, status: Callable[[], dict[str, Any]], on_change: Callable[[], None],
                 host: str = "127.0.0.1") -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def get_status(request: Request) -> JSONResponse:
            return JSONResponse(status())

        async def put_target(request: Request) -> JSONResponse:
            name = request.path_params["name"]
            try:
                body = await request.json()
                ms = analyst.set_target(name, body.get("target_ms") if isinstance(body, dict) else body)
            except json.JSONDecodeError:
                return JSONResponse({"error": 'body must be JSON like {"target_ms": 25}'}, 400)
            except UnknownContainer as err:
                return JSONResponse({"error": str(err)}, 404)
            except ScenarioError as err:
                return JSONResponse({"error": str(err)}, 400)
            on_change()
            return JSONResponse({"container": name, "target_ms": ms})

        async def delete_target(request: Request) -> JSONResponse:
            name = request.path_params["name"]
            try:
                analyst.remove_target(name)
            except UnknownContainer as err:
                return JSONResponse({"error": str(err)}, 404)
            on_change()
            return JSONResponse({"container": name, "target_ms": None})

        # {name:path}: any name, a "/" in it too, reaches the analyst, which answers for names it does not know
        app = Starlette(routes=[Route("/status", get_status),
                                Route("/targets/{name:path}", put_target, methods=["PUT"]),
                                Route("/targets/{name:path}", delete_target, methods=["DELETE"])])
        self.url = f"http://{host}:{free_port(host)}"
        port = int(self.url.rsplit(":", 1)[1])
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="qoe-control")

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Replace ``run_dir/status.json`` atomically."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(run_dir / STATUS_FILE, json.dumps(status, indent=2))


def read_status(run_dir: Path) -> dict[str, Any]:
    """The last status a manager wrote in ``run_dir``, with ``running`` telling whether it still runs."""
    path = run_dir / STATUS_FILE
    try:
        status = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContainerError(f"no QoE manager status in {run_dir} (no {STATUS_FILE}); start one with autotune qoe run") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ContainerError(f"cannot read {path}: {err}") from None
    status["running"] = _alive(status.get("pid"))
    return status


def change_target(run_dir: Path, name: str, target_ms: float | None) -> dict[str, Any]:
    """Set (or, with None, remove) a running manager's target for ``name`` through its API."""
    import requests

    status = read_status(run_dir)
    if not status["running"]:
        raise ContainerError(f"the QoE manager of {run_dir} is not running")
    url = f"{status['control_url']}/targets/{quote(name, safe='')}"
    try:
        reply = requests.delete(url, timeout=5) if target_ms is None else requests.put(
            url, json={"target_ms": target_ms}, timeout=5)
    except requests.RequestException as err:
        raise ContainerError(f"the QoE manager at {status['control_url']} is not answering: {type(err).__name__}") from None
    document = reply_object(reply)
    error = document.get("error") if document else None
    if reply.status_code == 404:  # the analyst's line, or the router's plain "Not Found" for a path it has no route to
        raise UnknownContainer(error if isinstance(error, str) else f"no container named {name!r}")
    if reply.status_code != 200:
        raise ScenarioError(error if isinstance(error, str) else f"the QoE manager answered HTTP {reply.status_code}")
    if document is None:
        raise ContainerError(f"the QoE manager at {status['control_url']} answered with something other than JSON")
    return document


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
