"""The chunk store: a set's resident chunk data written once into the exp dir as flat files and
memory-mapped by every learner of a machine, so that the page cache holds one copy for all.

A store is a directory ``<root>/<set>-<key>/`` of raw arrays (``<name>.bin``, native byte order)
and ``meta.json`` (their dtypes and shapes, the key, who wrote it and how long it took). The key
is a digest of everything the arrays are made of (:func:`chunk_set_key`), so a changed input
makes a new store beside the old one, never a stale read. One process writes it, whichever takes
the lock file ``<set>-<key>.lock`` first (``flock``; on NFS the kernel maps it to a POSIX lock,
which the server arbitrates, so the nodes of a shared exp dir exclude each other too), into
``<set>-<key>.<host>-<pid>.tmp/`` which it renames when complete; the others wait on the lock,
then map what it wrote. The pipeline removes ``*.tmp`` left by a killed run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from asrtrain import AsrtrainError

log = logging.getLogger(__name__)

#: Bumped when the layout of a store changes: an older store then gets a new key.
STORE_VERSION = 1
#: Seconds between the tries of a learner waiting for another one's store, and between its
#: log lines about it.
POLL_S, WAIT_LOG_S = 0.5, 60.0

Layout = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]
_ARK = re.compile(r"^(.*):\d+(\[[^\]]*\])?$")


def chunk_set_key(chunks, dtype: torch.dtype) -> str:
    """A digest of what a :class:`~asrtrain.train.chunks.ChunkSet`'s store is made of: the
    utterances in order with their ``feats.scp``, ``ali.scp`` and appended-stream entries,
    speakers and frame counts; the CMVN statistics' entries; the size and modification time of
    every ark they point into (a rewritten ark changes it); ``norm_vars``, the chunk length,
    the i-vector period, the storage type and :data:`STORE_VERSION`. Δ/ΔΔ are not stored, so
    the delta order is not part of it."""
    chunks.need_tables("the chunk store's key")
    reader, data = chunks.reader, chunks.reader.data
    h = hashlib.sha256()
    head = {"version": STORE_VERSION, "dtype": str(dtype), "chunk": chunks.chunk,
            "norm_vars": bool(reader.transform.norm_vars),
            "streams": [[s.name, getattr(s, "period", 0)] for s in reader.streams]}
    h.update(json.dumps(head, sort_keys=True).encode())
    specs: list[str] = []
    for u in chunks.utts:
        line = [u, data.feats[u], chunks.ali[u], data.utt2spk.get(u, ""),
                str(chunks.num_frames[u])] + [s.table[u] for s in reader.streams]
        specs += line[1:3] + line[5:]
        h.update("\t".join(line).encode() + b"\n")
    for spk in sorted(data.cmvn):
        specs.append(data.cmvn[spk])
        h.update(f"cmvn\t{spk}\t{data.cmvn[spk]}\n".encode())
    arks = {m.group(1) for m in map(_ARK.match, specs) if m}
    for ark in sorted(arks):
        try:
            st = os.stat(ark)
            h.update(f"ark\t{ark}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"ark\t{ark}\tmissing\n".encode())
    return h.hexdigest()[:20]


def open_store(root: str | Path, name: str, key: str, layout: Layout,
               write: Callable[[dict[str, torch.Tensor]], None],
               what: str) -> tuple[dict[str, torch.Tensor], Path, bool]:
    """The arrays of store ``<root>/<name>-<key>``, mapped read-only (CPU tensors backed by the
    page cache): written first when it is missing, by ``write`` (it fills the writable mapped
    arrays of ``layout``) in the process that takes the lock, while the others wait. Returns
    (arrays, the store's directory, whether this process wrote it). ``what``: the data set, for
    messages."""
    root = Path(root)
    final = root / f"{name}-{key}"
    written = False
    if not (final / "meta.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / f"{name}-{key}.lock", what):
            if not (final / "meta.json").is_file():
                _write(final, key, layout, write, what)
                written = True
    return _map(final, layout), final, written


@contextmanager
def _locked(path: Path, what: str) -> Iterator[None]:
    """Hold the exclusive lock of ``path``, waiting (and saying so) while another process
    holds it; the holder's host and pid are written into the file for that message."""
    with open(path, "a+") as f:
        t0 = told = time.monotonic()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - told >= WAIT_LOG_S:
                    f.seek(0)
                    log.info("%s: waiting %.0f s for the chunk store written by %s (lock %s)",
                             what, time.monotonic() - t0, f.read().strip() or "?", path)
                    told = time.monotonic()
                time.sleep(POLL_S)
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{socket.gethostname()} pid {os.getpid()}\n")
            f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()


def _write(final: Path, key: str, layout: Layout,
           write: Callable[[dict[str, torch.Tensor]], None], what: str) -> None:
    total = sum(_nbytes(*spec) for spec in layout.values())
    free = shutil.disk_usage(final.parent).free
    if total > free:
        gib = 1 << 30
        raise AsrtrainError(f"{final.parent}: the chunk store of {what} needs {total / gib:.2f} "
                            f"GiB, the disk has {free / gib:.2f} GiB free; free some space or "
                            "use trainer.chunk_data=stream")
    tmp = final.parent / f"{final.name}.{socket.gethostname()}-{os.getpid()}.tmp"
    for stale in final.parent.glob(f"{final.name}.*.tmp"):  # a writer killed before: we hold
        shutil.rmtree(stale, ignore_errors=True)             # the lock, so none is running
    t0 = time.perf_counter()
    tmp.mkdir()
    try:
        maps, arrays = {}, {}
        for name, (dtype, shape) in layout.items():
            n = _nbytes(dtype, shape)
            if n == 0:
                (tmp / f"{name}.bin").touch()
                arrays[name] = torch.empty(shape, dtype=dtype)
                continue
            maps[name] = np.memmap(tmp / f"{name}.bin", dtype=np.uint8, mode="w+", shape=(n,))
            arrays[name] = torch.from_numpy(maps[name]).view(dtype).view(shape)
        write(arrays)
        for m in maps.values():
            m.flush()
        del arrays, maps
        meta = {"key": key, "data": what, "version": STORE_VERSION,
                "arrays": {k: [str(d).replace("torch.", ""), list(s)]
                           for k, (d, s) in layout.items()},
                "bytes": total, "host": socket.gethostname(), "pid": os.getpid(),
                "seconds": round(time.perf_counter() - t0, 3),
                "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s: wrote the chunk store %s (%.1f MiB) in %.1f s", what, final, total / (1 << 20),
             time.perf_counter() - t0)


def _map(final: Path, layout: Layout) -> dict[str, torch.Tensor]:
    """The store's arrays as read-only shared mappings of its files, checked against
    ``layout`` (a store of another layout under the same key is damaged: say which file)."""
    out = {}
    for name, (dtype, shape) in layout.items():
        path, n = final / f"{name}.bin", _nbytes(dtype, shape)
        size = path.stat().st_size if path.is_file() else -1
        if size != n:
            raise AsrtrainError(f"{path}: {size} bytes, expected {n} for {list(shape)} "
                                f"{str(dtype).replace('torch.', '')}; the chunk store is "
                                f"damaged: remove {final} and start again")
        if n == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        m = np.memmap(path, dtype=np.uint8, mode="r", shape=(n,))
        with warnings.catch_warnings():  # read-only on purpose: a write would fault, not
            warnings.simplefilter("ignore", UserWarning)  # change the file under the others
            out[name] = torch.from_numpy(m).view(dtype).view(shape)
    return out
