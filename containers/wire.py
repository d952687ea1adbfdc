"""The model server's wire format: HTTP bodies to lists of arrays and back.

Shared by the server and the client so both sides read and write bodies the same way.
Binary bodies are ``application/x-npy`` (one array) or ``application/x-npz`` (arrays named
``arr_0``, ``arr_1``... in order, as ``np.savez`` writes them); ``application/json`` bodies
are ``{"inputs": [...]}`` requests and ``{"outputs": [...], "model_ms": ...}`` replies.

Decoding never unpickles and checks every npy header against the bytes that follow it, so
a body cannot make the server allocate more than it sent. JSON is the exception: parsed into
Python lists, a body takes up to about 35 times its size, so servers keep a much smaller
limit for it (``DEFAULT_MAX_JSON_BYTES``) and large inputs travel as npy or npz.
"""

from __future__ import annotations

import io
import json
import lzma
import math
import re
import zipfile
import zlib

import numpy as np

from containers.errors import BadPayload

NPY = "application/x-npy"
NPZ = "application/x-npz"
JSON = "application/json"
MEDIA_TYPES = (NPY, NPZ, JSON)
# A JSON request of a batch of two 224x224 RGB images (3.1 MB each as float32 text) fits; its
# parse peaks at about 2.6x the body, a hostile one of empty lists at about 35x.
DEFAULT_MAX_JSON_BYTES = 8 * 1024 * 1024

_NPZ_MEMBER = re.compile(r"arr_(\d+)\.npy")


def media_type(content_type: str | None) -> str | None:
    """The supported media type named by a Content-Type header (parameters ignored), else None."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media if media in MEDIA_TYPES else None


def encode_arrays(arrays: list[np.ndarray]) -> tuple[str, bytes]:
    """``(media type, body)``: npy for one array, npz for several."""
    buffer = io.BytesIO()
    if len(arrays) == 1:
        np.save(buffer, arrays[0], allow_pickle=False)
        return NPY, buffer.getvalue()
    np.savez(buffer, *arrays)
    return NPZ, buffer.getvalue()


def decode_arrays(media: str, body: bytes, max_bytes: int | None = None) -> list[np.ndarray]:
    """The arrays in an npy or npz body.

    Args:
        media: ``NPY`` or ``NPZ``.
        body: the raw body.
        max_bytes: the most an npz body may expand to when unzipped (a compressed npz is
            small on the wire); None for no limit.

    Raises:
        BadPayload: not a valid body of that type.
    """
    if media == NPY:
        return [_read_npy(body)]
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            members = archive.infolist()
            if max_bytes is not None and sum(m.file_size for m in members) > max_bytes:
                raise BadPayload(f"npz body unzips to more than {max_bytes} bytes")
            matches = (_NPZ_MEMBER.fullmatch(m.filename) for m in members)
            indices = sorted(int(match.group(1)) for match in matches if match)
            if not members or indices != list(range(len(members))):
                raise BadPayload(f"npz body must hold arrays named arr_0, arr_1... in input order; "
                                 f"got {sorted(m.filename.removesuffix('.npy') for m in members)}")
            return [_read_npy(archive.read(f"arr_{i}.npy")) for i in indices]
    except RuntimeError as err:  # an encrypted member, which needs a password
        raise BadPayload(f"npz body cannot be read: {err}; send an unencrypted npz") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, NotImplementedError, OSError,
            EOFError) as err:
        raise BadPayload(f"body is not a valid npz archive: {err}") from None


def decode_json_inputs(body: bytes, dtypes: list[str]) -> list[np.ndarray]:
    """The arrays of a ``{"inputs": [...]}`` body, input ``i`` converted to ``dtypes[i]``.

    Inputs beyond ``len(dtypes)`` keep NumPy's own dtype so the model's check can report
    the count mismatch.
    """
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as err:
        raise BadPayload(f"body is not valid JSON: {err}") from None
    except RecursionError:
        raise BadPayload("JSON body is nested too deeply to be an array of inputs") from None
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, list):
        raise BadPayload('JSON body must be {"inputs": [one nested list per model input]}')
    try:
        return [np.asarray(value, dtype=dtypes[i] if i < len(dtypes) else None) for i, value in enumerate(inputs)]
    except (TypeError, ValueError, OverflowError) as err:
        raise BadPayload(f"JSON inputs are not rectangular numeric arrays: {err}") from None
    except RecursionError:
        raise BadPayload("JSON inputs are nested too deeply to be arrays") from None


def encode_json_outputs(outputs: list[np.ndarray], model_ms: float) -> bytes:
    """A ``{"outputs": [...], "model_ms": ...}`` reply body."""
    return json.dumps({"outputs": [o.tolist() for o in outputs], "model_ms": model_ms}).encode()


def _read_npy(data: bytes) -> np.ndarray:
    """One array from npy bytes, refusing pickles and headers that disagree with the data."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise BadPayload(f"npy format version {version[0]}.{version[1]} is not supported; use 1.0 or 2.0")
        shape, fortran_order, dtype = read_header(stream)
    except (ValueError, TypeError) as err:
        raise BadPayload(f"body is not a valid npy array: {err}") from None
    if dtype.hasobject:
        raise BadPayload(f"npy array has dtype {dtype}, which needs pickle; send plain numeric arrays")
    if dtype.itemsize == 0:
        raise BadPayload(f"npy array has dtype {dtype} of zero bytes per item; send plain numeric arrays")
    if any(d < 0 for d in shape):
        raise BadPayload(f"npy header declares shape {list(shape)}; dimensions must not be negative")
    count = math.prod(shape)
    if len(data) - stream.tell() != count * dtype.itemsize:
        raise BadPayload(f"npy header declares shape {list(shape)} {dtype} ({count * dtype.itemsize} bytes) "
                         f"but {len(data) - stream.tell()} bytes follow it")
    try:
        array = np.frombuffer(data, dtype=dtype, count=count, offset=stream.tell())
        return array.reshape(shape, order="F" if fortran_order else "C")
    except ValueError as err:  # a shape NumPy cannot make: too many dimensions, too large a size
        raise BadPayload(f"npy header declares shape {list(shape)} {dtype}, not a usable array: {err}") from None
