"""The model server as a real process on a real artifact, its client, and the batching model under it."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from autotune.errors import UsageError
from autotune.runner import run_artifact
from containers import wire
from containers.client import InferenceClient
from containers.errors import ContainerError, InferenceRejected
from results.artifact import ArtifactWriter, library_name, open_artifact
from results.errors import InputMismatch
from results.inference import ArtifactModel

ROOT = Path(__file__).resolve().parent.parent
BODY_LIMIT = 100_000  # bytes: room for a few MLP rows (3 KiB each), small enough to overflow cheaply


@contextmanager
def running_server(artifact: Path, log: Path) -> Iterator[str]:
    """``python -m containers.server`` on a free port; yields its URL once /health answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "containers.server", str(artifact), "--port", str(port), "--threads", "1",
               "--max-body-bytes", str(BODY_LIMIT), "--name", "under-test"]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"server exited with {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"server did not answer /health in 60 s:\n{log.read_text()}"
            try:
                if requests.get(url + "/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def build_toy_artifact(out: Path) -> Path:
    """A real two-input, two-output artifact compiled at batch 2 and 4 only: ``(2x + y, x - y)`` on (B, 3).

    Built straight from Relax (seconds, no tuning) so padding and chunking have batch sizes to choose from.
    """
    import tvm
    from tvm import relax

    with ArtifactWriter(out) as writer:
        for batch in (2, 4):
            bb = relax.BlockBuilder()
            x = relax.Var("x", relax.TensorType((batch, 3), "float32"))
            y = relax.Var("y", relax.TensorType((batch, 3), "float32"))
            with bb.function("main", [x, y]):
                with bb.dataflow():
                    total = bb.emit(relax.op.add(relax.op.multiply(x, relax.const(2.0, "float32")), y))
                    diff = bb.emit(relax.op.subtract(x, y))
                    result = bb.emit_output(relax.Tuple([total, diff]))
                bb.emit_func_output(result)
            tvm.compile(bb.get(), target="llvm").export_library(str(writer.path / library_name(batch)))
        spec = {"shape": [2, 3], "dtype": "float32"}
        return writer.commit({"model": {"spec": "toy", "inputs": [{"name": "x", **spec}, {"name": "y", **spec}]},
                              "target": {"kind": "llvm"}, "libraries": {"2": library_name(2), "4": library_name(4)}})


def toy_inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return rng.standard_normal((n, 3)).astype("float32"), rng.standard_normal((n, 3)).astype("float32")


def rows(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, 784)).astype("float32")


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def npy_header(descr: str, shape: tuple[int, ...], data: bytes = b"") -> bytes:
    """An npy 1.0 body with a header as written (``np.save`` would refuse these), then ``data``."""
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + data


def encrypted_npz(array: np.ndarray) -> bytes:
    """An npz whose member is flagged as encrypted (``zipfile`` cannot write one, nor read it without a password)."""
    raw = bytearray(npz(arr_0=array))
    raw[raw.find(b"PK\x03\x04") + 6] |= 1  # local header's flags
    raw[raw.find(b"PK\x01\x02") + 8] |= 1  # central directory's flags
    return bytes(raw)


def corrupt_lzma_npz(array: np.ndarray) -> bytes:
    """An LZMA-compressed npz whose compressed stream is damaged."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_LZMA) as archive:
        archive.writestr("arr_0.npy", npy(array))
    raw = bytearray(buffer.getvalue())
    name, extra = struct.unpack("<HH", raw[26:30])
    start = 30 + name + extra
    raw[start + 4:start + 10] = b"\xa5" * 6
    return bytes(raw)


def metric(text: str, sample: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(sample)


@pytest.fixture(scope="module")
def toy_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_toy_artifact(tmp_path_factory.mktemp("toy") / "artifact")


@pytest.fixture(scope="module")
def mlp_model(tuned_run) -> ArtifactModel:
    return ArtifactModel(open_artifact(tuned_run.artifact))


@pytest.fixture(scope="module")
def mlp_url(tuned_run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tuned_run.artifact, tmp_path_factory.mktemp("logs") / "mlp.log") as url:
        yield url


@pytest.fixture(scope="module")
def toy_url(toy_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(toy_artifact, tmp_path_factory.mktemp("logs") / "toy.log") as url:
        yield url


# ArtifactModel and run_artifact, in process.

@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
def test_model_pads_and_chunks_to_compiled_batches(toy_artifact, n):
    x, y = toy_inputs(n)
    total, diff = ArtifactModel(open_artifact(toy_artifact))([x, y])
    np.testing.assert_allclose(total, 2 * x + y, rtol=1e-6)
    np.testing.assert_allclose(diff, x - y, rtol=1e-6)


@pytest.mark.parametrize(("arrays", "phrase"), [
    (lambda x, y: [x], "takes 2 input(s); got 1"),
    (lambda x, y: [x, y[:, :2]], "input 1 (y) has shape [3, 2] float32; expected [batch, 3] float32"),
    (lambda x, y: [x.astype("float64"), y], "input 0 (x) has shape [3, 3] float64; expected [batch, 3] float32"),
    (lambda x, y: [x, y[:2]], "input 1 (y) has batch size 2; input 0 has 3"),
    (lambda x, y: [x[:0], y[:0]], "batch size 0"),
    (lambda x, y: [x.tolist(), y], "input 0 (x) is a list"),
])
def test_model_names_the_input_that_does_not_fit(toy_artifact, arrays, phrase):
    with pytest.raises(InputMismatch, match=re.escape(phrase)):
        ArtifactModel(open_artifact(toy_artifact))(arrays(*toy_inputs(3)))


def test_run_artifact_runs_uncompiled_batch_sizes(tuned_run, mlp_model, tmp_path):
    x = rows(3)
    np.save(tmp_path / "x.npy", x)
    (out,) = run_artifact(tuned_run.artifact, [tmp_path / "x.npy"])
    assert out.shape == (3, 10)
    for i in range(3):
        np.testing.assert_allclose(out[i:i + 1], mlp_model([x[i:i + 1]])[0], rtol=1e-5, atol=1e-6)
    np.save(tmp_path / "wrong.npy", np.zeros((2, 5), dtype="float32"))
    with pytest.raises(UsageError, match=r"shape \[2, 5\] float32; expected \[batch, 784\] float32 \(--input .*wrong"):
        run_artifact(tuned_run.artifact, [tmp_path / "wrong.npy"])


# The server process.

def test_npy_json_and_npz_replies_match_run_artifact(tuned_run, mlp_url, tmp_path):
    x = rows(1)
    np.save(tmp_path / "x.npy", x)
    (expected,) = run_artifact(tuned_run.artifact, [tmp_path / "x.npy"])
    client = InferenceClient(mlp_url, timeout_s=10)
    reply = client.infer([x])
    np.testing.assert_allclose(reply.outputs[0], expected, rtol=1e-5, atol=1e-6)
    assert 0 < reply.model_ms <= reply.server_ms <= reply.client_ms
    as_json = requests.post(mlp_url + "/v1/infer", json={"inputs": [x.tolist()]}, timeout=10)
    assert as_json.status_code == 200 and float(as_json.headers["X-Model-Ms"]) > 0
    np.testing.assert_allclose(np.array(as_json.json()["outputs"][0], dtype="float32"), expected, rtol=1e-5, atol=1e-6)
    assert as_json.json()["model_ms"] > 0
    as_npz = requests.post(mlp_url + "/v1/infer", data=npz(arr_0=x), headers={"Content-Type": "application/x-npz"},
                           timeout=10)
    assert as_npz.headers["Content-Type"] == "application/x-npy" and float(as_npz.headers["X-Server-Ms"]) > 0
    np.testing.assert_allclose(np.load(io.BytesIO(as_npz.content), allow_pickle=False), expected, rtol=1e-5, atol=1e-6)
    client.close()


def test_batch_above_the_compiled_sizes_is_answered_row_by_row(mlp_url, mlp_model):
    x = rows(3)
    (out,) = InferenceClient(mlp_url).infer([x]).outputs
    assert out.shape == (3, 10)
    for i in range(3):
        np.testing.assert_allclose(out[i], mlp_model([x[i:i + 1]])[0][0], rtol=1e-5, atol=1e-6)


def test_several_inputs_and_outputs_travel_as_npz_and_json(toy_url):
    x, y = toy_inputs(3)
    total, diff = InferenceClient(toy_url).infer([x, y]).outputs
    np.testing.assert_allclose(total, 2 * x + y, rtol=1e-6)
    np.testing.assert_allclose(diff, x - y, rtol=1e-6)
    reply = requests.post(toy_url + "/v1/infer", json={"inputs": [x.tolist(), y.tolist()]}, timeout=10).json()
    np.testing.assert_allclose(np.array(reply["outputs"][1], dtype="float32"), x - y, rtol=1e-6)


def test_a_cpu_server_runs_on_the_runtime_library_without_pytorch(toy_artifact):
    """What a server process loads is how soon a new replica serves and how much memory each one holds."""
    probe = ("import sys\n"
             "import numpy as np\n"
             "from containers.server import load_model\n"
             f"model = load_model({str(toy_artifact)!r})\n"
             "x = np.arange(6, dtype='float32').reshape(2, 3)\n"
             "print(model([x, x])[0].tolist())\n"
             "maps = open('/proc/self/maps').read()\n"
             "print('libtvm_compiler' in maps, 'libtorch' in maps, sys.modules.get('torch'))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    outputs, loaded = out.stdout.splitlines()
    assert outputs == str((3 * np.arange(6, dtype="float32").reshape(2, 3)).tolist())
    assert loaded == "False False None"


def test_health_describes_the_model(mlp_url):
    health = InferenceClient(mlp_url).health()
    assert health["status"] == "ok" and health["name"] == "under-test" and health["threads"] == 1
    assert health["batch_sizes"] == [1] and health["model"]["inputs"][0]["shape"] == [1, 784]


def test_metrics_count_requests_items_and_latency(mlp_url):
    client = InferenceClient(mlp_url)
    before = client.metrics_text()
    client.infer([rows(2)])
    with pytest.raises(InferenceRejected):
        client.infer([np.zeros((1, 5), dtype="float32")])
    after = client.metrics_text()
    moved = [metric(after, name, **labels) - metric(before, name, **labels) for name, labels in [
        ("autotune_requests_total", {"outcome": "ok"}), ("autotune_requests_total", {"outcome": "client_error"}),
        ("autotune_items_total", {}), ("autotune_request_seconds_count", {}), ("autotune_inference_seconds_count", {})]]
    assert moved == [1, 1, 2, 1, 1]
    assert metric(after, "autotune_requests_total", outcome="server_error") == 0
    for le in ("0.0001", "0.00015", "28.8", "+Inf"):  # 0.1 ms to about 30 s in x1.5 steps, for percentiles
        metric(after, "autotune_inference_seconds_bucket", le=le)


def _chunked(size: int) -> Iterator[bytes]:
    for _ in range(size // 10_000):
        yield b"\0" * 10_000


@pytest.mark.parametrize(("content_type", "body", "status", "phrase"), [
    ("application/x-npy", b"not an array", 400, "not a valid npy array"),
    ("application/x-npy", npy(rows(1))[:-4], 400, "bytes follow it"),
    ("application/x-npy", npy(np.array([{"a": 1}], dtype=object), allow_pickle=True), 400, "needs pickle"),
    ("application/x-npz", b"PK not a zip", 400, "not a valid npz"),
    ("application/x-npz", npz(x=rows(1)), 400, "named arr_0"),
    ("application/json", b'{"inputs": [[[1, 2], [3]]]}', 400, "not rectangular"),
    ("application/json", b'{"rows": []}', 400, '{"inputs"'),
    ("application/x-npy", npy(np.zeros((1, 5), dtype="float32")), 422, "has shape [1, 5] float32; expected [batch, 784]"),
    ("application/json", b'{"inputs": [[[1, 2, 3]]]}', 422, "has shape [1, 3]"),
    ("application/x-npy", b"\0" * (BODY_LIMIT + 1), 413, "over this server's"),
    ("application/x-npy", _chunked(2 * BODY_LIMIT), 413, "over this server's"),
    ("text/csv", b"1,2,3", 415, "unsupported Content-Type 'text/csv'"),
    ("application/x-npy", npy_header("<f4", (-1, -1), b"\0" * 4), 400, "dimensions must not be negative"),
    ("application/x-npy", npy_header("|V0", (5,)), 400, "zero bytes per item"),
    ("application/x-npy", npy_header("<f4", (1,) * 70, b"\0" * 4), 400, "not a usable array"),
    ("application/json", b'{"inputs": [' + b"[" * 5000 + b"]" * 5000 + b"]}", 400, "nested too deeply"),
    ("application/x-npz", encrypted_npz(rows(1)), 400, "is encrypted"),
    ("application/x-npz", corrupt_lzma_npz(rows(1)), 400, "not a valid npz archive"),
])
def test_bad_requests_get_one_line_and_the_server_keeps_serving(mlp_url, content_type, body, status, phrase):
    refused = requests.post(mlp_url + "/v1/infer", data=body, headers={"Content-Type": content_type}, timeout=10)
    assert refused.status_code == status, refused.text
    assert phrase in refused.json()["error"] and "\n" not in refused.json()["error"]
    ok = requests.post(mlp_url + "/v1/infer", data=npy(rows(1)), headers={"Content-Type": "application/x-npy"}, timeout=10)
    assert ok.status_code == 200 and np.load(io.BytesIO(ok.content), allow_pickle=False).shape == (1, 10)


@contextmanager
def app_server(app: Any) -> Iterator[str]:
    """An ASGI app served by uvicorn in a thread of this process; yields its URL once it has started."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_json_bodies_have_a_much_smaller_limit_than_binary_ones(toy_artifact):
    from autotune.models.zoo import ZOO
    from containers.server import DEFAULT_MAX_BODY_BYTES, create_app

    limit = wire.DEFAULT_MAX_JSON_BYTES
    assert limit <= DEFAULT_MAX_BODY_BYTES // 8
    rng = np.random.default_rng(0)
    for name, entry in ZOO.items():  # a JSON request of one item of every model here still fits
        item = rng.standard_normal(entry.input_shape).astype("float32")
        assert len(json.dumps({"inputs": [item.tolist()]})) < limit / 2, name
    hostile = b'{"inputs": [[' + b"[]," * (limit // 3) + b"[]]]}"  # ~35x its size once parsed
    with app_server(create_app(ArtifactModel(open_artifact(toy_artifact)), "toy", None)) as url:
        for body in (hostile, iter([hostile[:limit // 2], hostile[limit // 2:]])):  # declared, then streamed
            refused = requests.post(url + "/v1/infer", data=body, headers={"Content-Type": "application/json"},
                                    timeout=30)
            assert refused.status_code == 413, refused.text
            assert refused.json()["error"].endswith(f"over this server's {limit}-byte limit for JSON; send large "
                                                    f"inputs in the binary format (application/x-npy, or "
                                                    f"application/x-npz for several inputs)")
        wide = np.zeros((limit // 40 + 1, 5), dtype="float32")
        big = npz(arr_0=wide, arr_1=wide)  # past the JSON limit, decoded all the same
        assert len(big) > limit
        mismatch = requests.post(url + "/v1/infer", data=big, headers={"Content-Type": "application/x-npz"}, timeout=30)
        assert mismatch.status_code == 422 and "input 0 (x) has shape" in mismatch.json()["error"]
        x, y = toy_inputs(2)
        small = requests.post(url + "/v1/infer", json={"inputs": [x.tolist(), y.tolist()]}, timeout=10)
        assert small.status_code == 200, small.text


def test_client_raises_the_server_error_line(mlp_url):
    with pytest.raises(InferenceRejected, match=r"422: input 0 \(x\) has shape \[1, 5\]") as caught:
        InferenceClient(mlp_url).infer([np.zeros((1, 5), dtype="float32")])
    assert caught.value.status == 422
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(ContainerError, match="cannot reach the model server"):
        InferenceClient(nobody, timeout_s=2).health()


class FailingModel(ArtifactModel):
    """A model whose every run fails the way a lost device would."""

    def __call__(self, arrays):
        raise RuntimeError("device lost\ntraceback lines the client should not see")


def test_unexpected_failure_is_a_500_line_and_the_app_keeps_serving(toy_artifact):
    from containers.server import create_app

    app = create_app(FailingModel(open_artifact(toy_artifact)), "failing", None, BODY_LIMIT)
    with app_server(app) as url:
        client = InferenceClient(url, timeout_s=10)
        with pytest.raises(InferenceRejected, match="500: inference failed: RuntimeError: device lost$"):
            client.infer(list(toy_inputs(2)))
        assert client.health()["name"] == "failing"
        assert metric(client.metrics_text(), "autotune_requests_total", outcome="server_error") == 1


@pytest.mark.parametrize("damage", ["missing", "tampered"])
def test_bad_artifact_exits_2_with_one_line(tuned_run, tmp_path, damage):
    artifact = tmp_path / "artifact"
    if damage == "tampered":
        shutil.copytree(tuned_run.artifact, artifact)
        (artifact / "profile.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "containers.server", str(artifact), "--port", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert ("has no manifest.json" if damage == "missing" else "refusing to load it") in proc.stderr


@pytest.mark.parametrize("damage, says", [
    (lambda m: m.pop("model"), "has no 'model' object"),
    (lambda m: m.pop("target"), "has no 'target' object"),
    (lambda m: m["model"].update(inputs="x"), "has no 'model' object"),
    (lambda m: m["model"]["inputs"][0].update(shape=[2, -3]), "has no 'model' object"),
    (lambda m: m["model"]["inputs"][1].update(dtype="object"), "has no 'model' object"),
    (lambda m: m["target"].pop("kind"), "has no 'target' object"),
])
def test_a_manifest_without_what_the_server_reads_exits_2_with_one_line(toy_artifact, tmp_path, damage, says):
    artifact = shutil.copytree(toy_artifact, tmp_path / "artifact")
    manifest = json.loads((artifact / "manifest.json").read_text())
    damage(manifest)
    (artifact / "manifest.json").write_text(json.dumps(manifest))  # the manifest is not among the hashed files
    open_artifact(artifact)  # what open_artifact checks still holds
    proc = subprocess.run([sys.executable, "-m", "containers.server", str(artifact), "--port", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr


def test_run_artifact_refuses_an_empty_input_file_with_one_line(toy_artifact, tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "y.npy", toy_inputs(2)[1])
    with pytest.raises(UsageError, match=f"^cannot read input {tmp_path / 'empty.npy'}: it is empty; expected a .npy"):
        run_artifact(toy_artifact, [tmp_path / "empty.npy", tmp_path / "y.npy"])
