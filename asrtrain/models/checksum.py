"""sha256 sidecars of checkpoints: ``epoch-3.pt`` has ``epoch-3.pt.sha256`` beside it.

A checkpoint cut short (a full disk, a copy interrupted) or altered after it was written (a NaN
written into it, a flipped byte) must be found when it is read, not at the first training step
or by a decode that dies on it, and a rerun of the recipe must notice it to redo the model. The
writer records the sha256 of the bytes it wrote; every reader compares. The sidecar is in
``sha256sum``'s format, so ``cd train/<model> && sha256sum -c *.sha256`` checks a model dir by
hand. A checkpoint without a sidecar (written before checksums were kept) is only checked to be a
whole zip archive, as ``torch.save`` writes them: that finds one cut short, not one altered.

No torch here: the pipeline checks ``final.pt`` while it plans, before any stage runs.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text

SUFFIX = ".sha256"
_CHUNK = 1 << 20


def sidecar(path: str | Path) -> Path:
    """Where the checksum of ``path`` is kept."""
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of the bytes of ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def write_sidecar(path: str | Path, digest: str) -> None:
    """Record ``digest`` as the sha256 of ``path`` (atomically; ``sha256sum -c`` format)."""
    write_text(sidecar(path), f"{digest}  {Path(path).name}\n")


def recorded(path: str | Path) -> str | None:
    """The sha256 recorded for ``path``, or None when it has no sidecar.

    Raises:
        AsrtrainError: the sidecar is not a sha256 line (naming the sidecar).
    """
    side = sidecar(path)
    if not side.is_file():
        return None
    fields = side.read_text(encoding="utf-8", errors="replace").split()
    if not fields or len(fields[0]) != 64 or any(c not in "0123456789abcdef" for c in fields[0]):
        raise AsrtrainError(f"{side}: not a sha256 line (expected '<64 hex digits>  "
                            f"{Path(path).name}')")
    return fields[0]


def damage(path: str | Path, data: bytes | None = None) -> str | None:
    """Why ``path`` cannot be trusted ("missing", "cut short or altered: ..."), or None when it
    matches its sidecar or has none. ``data``: its bytes, when the caller read them already."""
    path = Path(path)
    if data is None and not path.is_file():
        return "missing"
    try:
        want = recorded(path)
    except AsrtrainError:
        return f"its checksum file {sidecar(path).name} is not a sha256 line"
    if want is None:
        whole = zipfile.is_zipfile(io.BytesIO(data) if data is not None else path)
        return None if whole else (
            "cut short: not a whole zip archive, as torch.save writes (and no "
            f"{sidecar(path).name} to say more)")
    got = hashlib.sha256(data).hexdigest() if data is not None else sha256_file(path)
    if got != want:
        return (f"cut short or altered after it was written: its sha256 {got[:12]}... is not "
                f"the {want[:12]}... recorded in {sidecar(path).name} "
                f"({len(data) if data is not None else path.stat().st_size} "
                "bytes now)")
    return None


def verify(path: str | Path, data: bytes | None = None) -> None:
    """Raise if ``path`` is missing or differs from its recorded sha256.

    Raises:
        AsrtrainError: one line naming the file and what is wrong with it.
    """
    why = damage(path, data)
    if why == "missing":
        raise AsrtrainError(f"{path}: no such checkpoint")
    if why is not None:
        raise AsrtrainError(f"{path}: {why}; rerun the recipe to redo it (training resumes "
                            "from the last good epoch checkpoint)")


def remove(path: str | Path) -> None:
    """Delete ``path`` and its sidecar (either may be absent)."""
    Path(path).unlink(missing_ok=True)
    sidecar(path).unlink(missing_ok=True)
