"""Reading one matrix an scp points at (``file.ark:offset``), with the reason when it cannot be.

``kaldiio.load_mat`` on a truncated ark fails with an empty ``AssertionError`` or "buffer size
must be a multiple of element size"; :func:`load_matrix` says what is wrong instead: the file is
missing, it ends before the offset, or it ends before the matrix the header at the offset
declares ("file ends at byte N, the 98 x 40 float matrix needs 15,690").
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import kaldiio
import numpy as np

from asrtrain import AsrtrainError

#: Element sizes of Kaldi's binary matrix and vector tokens.
_ELEMENT = {b"FM": 4, b"DM": 8, b"FV": 4, b"DV": 8}
#: ``path:offset`` (no row or column range) of an scp value.
_PLAIN_ENTRY = re.compile(r"(.+):(\d+)")
#: A Kaldi binary int32 vector's elements: each a size byte (4) and the little-endian value.
_INT32_ELEMENT = np.dtype([("size", "u1"), ("value", "<i4")])


def load_matrix(spec: str, where: str) -> np.ndarray:
    """The matrix at ``spec`` (an scp value); an error starting with ``where`` (the scp and the
    key) and giving the reason when it cannot be read."""
    try:
        fast = _int32_vector(spec)
        return fast if fast is not None else np.asarray(kaldiio.load_mat(spec))
    except Exception as e:   # noqa: BLE001 - kaldiio raises anything from a bad file
        raise AsrtrainError(f"{where}: cannot read {spec}: {ark_problem(spec, e)}") from None


def _int32_vector(spec: str) -> np.ndarray | None:
    """The binary int32 vector at ``spec`` (an alignment: ``ali-to-pdf``'s output) read in one
    piece; kaldiio reads it element by element (5 bytes and a ``struct.unpack`` each, the
    streaming loader's largest cost). None where ``spec`` is not a plain ``path:offset`` of such
    a vector, or the bytes are not all there: kaldiio reads it then, and says what is wrong."""
    m = _PLAIN_ENTRY.fullmatch(spec.strip())
    if m is None:
        return None
    with open(m[1], "rb") as f:
        f.seek(int(m[2]))
        head = f.read(7)
        if len(head) != 7 or head[:3] != b"\0B\4":
            return None
        (n,) = struct.unpack("<i", head[3:])
        body = f.read(5 * n) if n >= 0 else b""
    if n < 0 or len(body) != 5 * n:
        return None
    elements = np.frombuffer(body, dtype=_INT32_ELEMENT)
    if not (elements["size"] == 4).all():
        return None
    return elements["value"].astype(np.int32)


def ark_problem(spec: str, error: BaseException | None = None) -> str:
    """Why the matrix at ``spec`` cannot be read: the file and the byte counts when the ark is
    missing or short, else the reader's own error (its type when it has no message)."""
    fallback = (f"{type(error).__name__}: {error}" if error is not None and str(error)
                else f"{type(error).__name__ if error is not None else 'error'} (not a Kaldi "
                "matrix at that offset)")
    m = re.fullmatch(r"(.+):(\d+)(\[[^\]]*\])?", spec.strip())
    if m is None:
        return fallback
    path, offset = Path(m[1]), int(m[2])
    if not path.exists():
        return f"no such file {path}"
    if not path.is_file():
        return f"{path} is not a file"
    size = path.stat().st_size
    if offset >= size:
        return f"{path} ends at byte {size:,}, before the matrix's offset {offset:,} (truncated)"
    try:
        need, what = _matrix_end(path, offset)
    except (OSError, ValueError, struct.error):
        return fallback
    if need is not None and need > size:
        return f"{path} ends at byte {size:,}, the {what} at byte {offset:,} needs {need:,} " \
               "(truncated)"
    return fallback


def _matrix_end(path: Path, offset: int) -> tuple[int | None, str]:
    """The byte where the binary Kaldi object at ``offset`` ends, as its header declares, and
    what it is; ``(None, '')`` when the header is not one read here."""
    with open(path, "rb") as f:
        f.seek(offset)
        head = f.read(32)
    if head[:2] != b"\0B":
        return None, ""
    if head[2:3] == b"\4" and len(head) >= 7:  # an int32 vector (alignments): no token
        (n,) = struct.unpack("<i", head[3:7])
        return offset + 7 + 5 * n, f"{n}-element int32 vector"
    token, rest = head[2:].split(b" ", 1)
    pos = offset + 2 + len(token) + 1
    if token in _ELEMENT:
        elem = _ELEMENT[token]
        kind = "float" if elem == 4 else "double"
        if token.endswith(b"V"):
            (n,) = struct.unpack("<i", rest[1:5])
            return pos + 5 + n * elem, f"{n}-dim {kind} vector"
        rows, cols = struct.unpack("<i", rest[1:5])[0], struct.unpack("<i", rest[6:10])[0]
        return pos + 10 + rows * cols * elem, f"{rows} x {cols} {kind} matrix"
    if token in (b"CM", b"CM2", b"CM3"):
        _, _, rows, cols = struct.unpack("<ffii", rest[:16])
        body = {b"CM": cols * 8 + rows * cols, b"CM2": rows * cols * 2,
                b"CM3": rows * cols}[token]
        return pos + 16 + body, f"{rows} x {cols} compressed matrix"
    return None, ""
