"""The chunk store (asrtrain.train.store): resident chunk data written once into the exp dir and
memory-mapped by every learner, against each learner's own in-memory copy, byte for byte, on
real kaldiio arks with real CMVN statistics (the data of tests/test_resident.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from test_resident import LENGTHS, NUM_PDFS, make_set, write_streams

import asrtrain.train.resident as resident
from asrtrain import AsrtrainError
from asrtrain.train.chunks import ChunkSet
from asrtrain.train.resident import ResidentChunks
from asrtrain.train.store import chunk_set_key


@pytest.fixture(scope="module")
def chunk_data(tmp_path_factory) -> tuple[Path, Path]:
    return make_set(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def streams(tmp_path_factory, chunk_data) -> dict[str, Path]:
    return write_streams(tmp_path_factory.mktemp("streams"), chunk_data[0])


def assert_identical(want, got) -> int:
    """The batches are equal byte for byte (dtypes, shapes, values); returns how many."""
    want, got = list(want), list(got)
    assert len(got) == len(want) > 0
    for w, g in zip(want, got, strict=True):
        for a, b in ((w.feats, g.feats), (w.targets, g.targets), (w.lengths, g.lengths)):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.cpu(), b.cpu())
    return len(want)


def stores(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


@pytest.mark.parametrize("append", [(), ("fmllr", "ivector")])
@pytest.mark.parametrize("delta_order", [0, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_store_gives_the_batches_of_the_in_memory_path(chunk_data, streams, tmp_path, append,
                                                       delta_order, dtype) -> None:
    cs = ChunkSet(*chunk_data, chunk=21, delta_order=delta_order, norm_vars=True,
                  streams={s: streams[s] for s in append})
    memory = ResidentChunks(cs, "cpu", dtype)
    mapped = ResidentChunks(cs, "cpu", dtype, store_dir=tmp_path)
    assert mapped.store_path is not None and mapped.store_path.parent == tmp_path
    assert memory.store_path is None
    for name in ("feats", "targets", "ivector_rows", "first", "utt_lo", "utt_hi", "length",
                 "row0"):
        a, b = getattr(memory, name), getattr(mapped, name)
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), name
    for seed, world, batch_size, block_utts in ((1, 1, 4, 3), (2, 2, 3, 2), (7, 3, 2, 256),
                                                (None, 2, 4, 256)):
        steps = cs.steps(seed, world, batch_size) if seed is not None else None
        for rank in range(world):
            args = (seed, rank, world, batch_size, block_utts, steps)
            assert_identical(memory.batches(*args), mapped.batches(*args))


def test_store_is_written_once_then_mapped_without_reading_an_ark(chunk_data, tmp_path,
                                                                  monkeypatch) -> None:
    cs = ChunkSet(*chunk_data, chunk=21, delta_order=2, norm_vars=True)
    first = ResidentChunks(cs, "cpu", store_dir=tmp_path)
    assert first.store_written
    (path,) = stores(tmp_path)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["arrays"]["feats"] == ["float16", [sum(LENGTHS) + 1, 6]]
    assert meta["key"] == chunk_set_key(cs, torch.float16) and path.name.endswith(meta["key"])
    assert not list(tmp_path.glob("*.tmp"))

    def no_ark(*_):
        raise AssertionError("the store exists: no ark may be read")

    resumed = ChunkSet(*chunk_data, chunk=21, delta_order=2, norm_vars=True)
    monkeypatch.setattr(resumed, "alignment", no_ark)
    monkeypatch.setattr(resident.ResidentChunks, "_read", no_ark)
    again = ResidentChunks(resumed, "cpu", store_dir=tmp_path)
    assert not again.store_written and again.store_path == path
    # the learner's frames are the file's pages, not a copy of them
    ptr = again.feats.data_ptr()
    maps = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()
            if line.endswith(str(path / "feats.bin"))]
    assert any(int(m[0].split("-")[0], 16) <= ptr < int(m[0].split("-")[1], 16)
               and m[1].startswith("r-") for m in maps), maps
    assert_identical(first.batches(3, 0, 1, 4), again.batches(3, 0, 1, 4))


def test_a_changed_input_makes_a_new_store(tmp_path: Path) -> None:
    data, ali = make_set(tmp_path / "set")
    root = tmp_path / "chunkstore"
    key = lambda **kw: chunk_set_key(ChunkSet(data, ali, chunk=kw.pop("chunk", 21), **kw),  # noqa: E731
                                     kw.pop("dtype", torch.float16))
    base = key(norm_vars=True)
    assert key(norm_vars=True, delta_order=2) == base  # Δ/ΔΔ are made in the gather
    assert key(norm_vars=False) != base
    assert key(norm_vars=True, chunk=25) != base
    assert chunk_set_key(ChunkSet(data, ali, norm_vars=True), torch.float32) != base
    ResidentChunks(ChunkSet(data, ali, norm_vars=True), "cpu", store_dir=root)
    # new alignments (a realignment rewrites ali.ark): same scp text, another ark
    rng = np.random.default_rng(5)
    with kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as wa:
        for line in (data / "utt2num_frames").read_text().splitlines():
            utt, n = line.split()
            wa(utt, rng.integers(0, NUM_PDFS, int(n)).astype(np.int32))
    cs = ChunkSet(data, ali, norm_vars=True)
    assert chunk_set_key(cs, torch.float16) != base
    rc = ResidentChunks(cs, "cpu", store_dir=root)
    assert rc.store_written and len(stores(root)) == 2
    assert torch.equal(rc.targets[:-1].long(), torch.cat(
        [torch.from_numpy(cs.alignment(u, cs.num_frames[u])) for u in cs.utts]))


def test_learners_starting_together_write_one_store(chunk_data, tmp_path) -> None:
    """Four learners of a machine (threads here: each opens the lock file itself, and flock
    locks belong to the open file) start at once: one writes, the others wait and map it."""
    out: list[ResidentChunks | BaseException] = []

    def learner() -> None:
        try:
            cs = ChunkSet(*chunk_data, chunk=21, delta_order=2, norm_vars=True)
            out.append(ResidentChunks(cs, "cpu", store_dir=tmp_path))
        except BaseException as e:
            out.append(e)

    threads = [threading.Thread(target=learner) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, ResidentChunks) for r in out), out
    assert sum(r.store_written for r in out) == 1
    assert len(stores(tmp_path)) == 1 and not list(tmp_path.glob("*.tmp"))
    for r in out[1:]:
        assert torch.equal(r.feats, out[0].feats)


def test_a_failed_write_leaves_nothing_and_a_damaged_store_is_named(tmp_path: Path) -> None:
    data, ali = make_set(tmp_path / "set", [30, 40])
    (data / "cmvn.scp").unlink()
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/big.ark,{tmp_path}/big.scp") as w:
        w("spk1-u01", np.full((40, 6), 1e5, dtype=np.float32))
    scp = (data / "feats.scp").read_text().splitlines()
    (data / "feats.scp").write_text(scp[0] + "\n" + (tmp_path / "big.scp").read_text())
    root = tmp_path / "chunkstore"
    for _ in range(2):  # the next learner tries again, and fails the same way
        with pytest.raises(AsrtrainError, match=r"overflow float16 storage"):
            ResidentChunks(ChunkSet(data, ali, chunk=21), "cpu", store_dir=root)
        assert not stores(root)
    rc = ResidentChunks(ChunkSet(data, ali, chunk=21), "cpu", torch.float32, store_dir=root)
    assert rc.feats[30:70].eq(1e5).all()
    feats = rc.store_path / "feats.bin"
    del rc
    with open(feats, "r+b") as f:
        f.truncate(100)
    with pytest.raises(AsrtrainError, match=r"feats.bin: 100 bytes, expected 1704 .* the chunk "
                                            r"store is damaged: remove .*chunkstore/data-"):
        ResidentChunks(ChunkSet(data, ali, chunk=21), "cpu", torch.float32, store_dir=root)


def test_a_mapped_store_is_not_refused_for_want_of_host_memory(chunk_data, tmp_path,
                                                                caplog) -> None:
    """A private copy that does not fit is refused; the mapped store is file pages that the
    kernel may evict and read back, so it runs with a warning."""
    cs = ChunkSet(*chunk_data, chunk=21)
    with pytest.raises(AsrtrainError, match="do not fit"):
        ResidentChunks(cs, "cpu", host_bytes=100)
    rc = ResidentChunks(cs, "cpu", host_bytes=100, store_dir=tmp_path)
    assert rc.store_device == torch.device("cpu") and not rc.pinned
    assert "page cache will not hold it all" in caplog.text


@pytest.mark.cuda
@pytest.mark.parametrize("gpu_share", [0.5, 0.0])
def test_gpu_learner_gets_the_batches_of_the_cpu_path(chunk_data, streams, tmp_path, device,
                                                      monkeypatch, gpu_share) -> None:
    """On a GPU: the store copied onto the GPU (it fits), or left mapped and gathered into
    pinned memory (GPU_SHARE 0: it does not), gives the CPU's batches byte for byte."""
    monkeypatch.setattr(resident, "GPU_SHARE", gpu_share)
    cs = ChunkSet(*chunk_data, chunk=21, delta_order=2, norm_vars=True, streams=streams)
    cpu = ResidentChunks(cs, "cpu")
    gpu = ResidentChunks(cs, device, store_dir=tmp_path)
    assert gpu.store_device.type == ("cuda" if gpu_share else "cpu")
    assert gpu.pinned == (not gpu_share)
    batches = list(gpu.batches(2, 1, 2, 3, 2, cs.steps(2, 2, 3)))
    assert all(b.feats.device.type == "cuda" for b in batches)
    assert_identical(cpu.batches(2, 1, 2, 3, 2, cs.steps(2, 2, 3)), batches)


def test_a_learner_forgets_the_tables_once_its_chunks_are_in_the_store(chunk_data, streams,
                                                                       tmp_path) -> None:
    """After ChunkSet.forget_tables a learner keeps no per-utterance table (data dir, ali.scp,
    the streams' scp, names, frame counts, CMVN statistics), only the first-chunk numbers, and
    its epochs are byte for byte those it served before; what needs a table says so."""
    cs = ChunkSet(*chunk_data, chunk=21, delta_order=2, norm_vars=True, streams=streams)
    rc = ResidentChunks(cs, "cpu", store_dir=tmp_path)
    plans = [(3, r, 2, 4, 3, cs.steps(3, 2, 4)) for r in range(2)] + [(None, 0, 1, 5, 256, None)]
    before = [list(rc.batches(*args)) for args in plans]
    # the batches' lengths are read from the store's mapped chunk table, not a copy of it
    assert rc.host_length.untyped_storage().data_ptr() == rc.first.untyped_storage().data_ptr()
    length = len(cs)
    cs.forget_tables()
    assert cs.utts == [] and not cs.ali and not cs.num_frames
    assert not any(v for v in vars(cs.reader.data).values() if isinstance(v, dict))
    assert not cs.reader.transform.cmvn and not any(s.table for s in cs.reader.streams)
    assert len(cs) == length and cs._first.nbytes == 8 * (len(LENGTHS) + 1)
    for args, want in zip(plans, before, strict=True):
        assert assert_identical(want, rc.batches(*args)) == len(want)
    assert cs.steps(3, 2, 4) == plans[0][-1]
    for call in (lambda: ResidentChunks(cs, "cpu", store_dir=tmp_path),
                 lambda: chunk_set_key(cs, torch.float16), cs.chunk_table,
                 lambda: cs.shard(3, 0, 2), lambda: next(cs.batches(3, 0, 2, 4)),
                 cs.pdf_counts):
        with pytest.raises(AsrtrainError, match=r"data: .* reads the per-utterance tables, "
                                                r"which this learner dropped"):
            call()
