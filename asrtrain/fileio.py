"""Crash-safe writing: every output is written under a temporary name and renamed into place."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def _umask() -> int:
    """The process's umask (read by setting it, then setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open ``path`` for writing through a temporary file in the same directory.

    The file appears under its real name only once the block finished without an exception, so an
    interrupted stage never leaves a half-written file behind and an earlier version stays intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # the mode open() would give (mkstemp's 0600 hides results from a team sharing exp)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory under a temporary name and swap it in when the block succeeds.

    An existing directory at ``path`` is replaced only after the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        tmp.chmod(0o777 & ~_umask())
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_ark(ark: str | os.PathLike, scp: str | os.PathLike) -> Iterator:
    """A kaldiio writer of a Kaldi ``ark`` and its ``scp``, both under temporary names of their
    own (two writers never collide), renamed into place when the block succeeds.

    The scp kaldiio writes names the temporary ark: it is rewritten to name ``ark`` as given
    (give an absolute path for an scp read from elsewhere). On failure both are removed.
    """
    ark, scp = Path(ark), Path(scp)
    tmp = []
    try:
        for path in (ark, scp):
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.close(fd)
            tmp.append(name)
        with ArkWriter(tmp[0], tmp[1]) as writer:
            yield writer
        text = Path(tmp[1]).read_text(encoding="utf-8").replace(tmp[0], str(ark))
        os.chmod(tmp[0], 0o666 & ~_umask())
        os.replace(tmp[0], ark)
        write_text(scp, text)
    finally:
        for name in tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)


class ArkWriter:
    """``kaldiio.WriteHelper("ark,scp:ARK,SCP")`` (``writer(key, array)``), writing the same
    bytes (``kaldiio.matio.write_array`` writes each array, and the scp lines are kaldiio's),
    but an int32 vector (an alignment) in one piece: kaldiio packs it element by element, a
    ``struct.pack`` and two writes a frame (a table of 174 utterances of 400 frames: 45 ms
    there, 3 ms here; a tiny mono pass writes ~9 such). ``tests/test_fileio.py`` compares the
    two writers' files."""

    def __init__(self, ark: str | os.PathLike, scp: str | os.PathLike) -> None:
        self.name = str(ark)
        self._ark = open(ark, "wb")  # noqa: SIM115 - closed by close()
        try:
            self._scp = open(scp, "w", encoding="utf-8")  # noqa: SIM115
        except BaseException:
            self._ark.close()    # no writer to close it: the caller never gets one
            raise

    def __call__(self, key: str, array: np.ndarray) -> None:
        import numpy as np
        from kaldiio.matio import write_array

        assert isinstance(array, np.ndarray), type(array)
        self._ark.write(f"{key} ".encode())
        offset = self._ark.tell()
        if array.dtype == np.int32 and array.ndim == 1:
            # Kaldi's binary int32 vector: each element a size byte (4), then its value
            body = np.empty(len(array), np.dtype([("size", "u1"), ("value", "<i4")]))
            body["size"] = 4
            body["value"] = array
            self._ark.write(b"\0B\4" + np.int32(len(array)).astype("<i4").tobytes())
            self._ark.write(body.tobytes())
        else:
            write_array(self._ark, array)
        self._scp.write(f"{key} {self.name}:{offset}\n")

    __setitem__ = __call__

    def close(self) -> None:
        try:
            self._ark.close()
        finally:
            self._scp.close()

    def __enter__(self) -> ArkWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def remove_temporaries(root: str | os.PathLike) -> int:
    """Remove every ``*.tmp`` file or directory under ``root``; return how many.

    Outputs are written under such names and renamed into place when complete, so one still
    there is what a killed run (a full disk, ``kill -9``) left half-written. Call it only while
    no one else writes under ``root`` (the pipeline holds the experiment's lock).
    """
    found = [p for p in Path(root).rglob("*.tmp")]
    for p in sorted(found, key=lambda p: len(p.parts), reverse=True):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    return len(found)


def describe_os_error(error: OSError, where: Path) -> str:
    """One line for an error of the file system (``where``: the directory it happened under,
    when the error does not name a file, as one raised in a worker process may not)."""
    path = error.filename or where
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device of {path}: free some, then run the same command"
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {path}: {error.strerror}"
    return f"{path}: {error.strerror or error}"
