"""Device-resident chunk data (asrtrain.train.resident) against the streaming loader of before,
batch for batch, on real kaldiio arks with real CMVN statistics."""

import random
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch

from asrtrain import AsrtrainError
from asrtrain.data.datadir import DataDir
from asrtrain.features.transform import cmvn_stats
from asrtrain.train.chunks import IGNORE, ChunkSet
from asrtrain.train.resident import ResidentChunks, bytes_per_frame, place

NUM_PDFS = 500
# shorter than a chunk (5, 12), exact multiples (21, 42), a last chunk that overlaps (47, 50, 100)
LENGTHS = [5, 21, 47, 63, 12, 100, 42, 50, 30, 77, 8, 64, 90, 23]


def make_set(root: Path, lengths: list[int] = LENGTHS, dim: int = 6,
             data_dir: str = "data") -> tuple[Path, Path]:
    """A data dir (``root/data_dir``) of random features with per-speaker offsets (3 speakers),
    its cmvn.scp, and random alignments (``root/ali``)."""
    rng = np.random.default_rng(0)
    data, ali = root / data_dir, root / "ali"
    data.mkdir(parents=True)
    ali.mkdir()
    d = DataDir()
    mats: dict[str, list[np.ndarray]] = {}
    with kaldiio.WriteHelper(f"ark,scp:{root}/f.ark,{root}/f.scp") as wf, \
            kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as wa:
        for i, n in enumerate(lengths):
            spk = f"spk{i % 3}"
            utt = f"{spk}-u{i:02d}"
            m = (rng.normal(size=(n, dim)) * (1 + i % 3) + 5 * (i % 3)).astype(np.float32)
            wf(utt, m)
            mats.setdefault(spk, []).append(m)
            wa(utt, rng.integers(0, NUM_PDFS, n).astype(np.int32))
            d.wav[utt], d.text[utt], d.utt2spk[utt], d.utt2num_frames[utt] = "/dev/null", "x", \
                spk, n
    with kaldiio.WriteHelper(f"ark,scp:{root}/cmvn.ark,{root}/cmvn.scp") as wc:
        for spk, ms in mats.items():
            wc(spk, cmvn_stats(ms))
    for table, name in ((d.feats, "f.scp"), (d.cmvn, "cmvn.scp")):
        for line in (root / name).read_text().splitlines():
            k, v = line.split(maxsplit=1)
            table[k] = v
    d.write(data)
    (ali / "num_pdfs").write_text(f"{NUM_PDFS}\n")
    return data, ali


def write_streams(root: Path, data: Path, fmllr_dim: int = 4, ivector_dim: int = 5,
                  period: int = 3, seed: int = 1) -> dict[str, Path]:
    """The appended streams of the set in ``data`` in the shared layout (issue 13): an fMLLR
    dir (``feats.scp``, the set's frames; values far from the fbank ones) and an i-vector dir
    (``ivector_online.scp`` with ``ceil(T / period)`` rows, one more for every other
    utterance, which must be ignored; ``ivector_period``). Returns {stream: dir}."""
    rng = np.random.default_rng(seed)
    fmllr, ivec = root / "fmllr", root / "ivectors"
    fmllr.mkdir()
    ivec.mkdir()
    d = DataDir.read(data)
    with kaldiio.WriteHelper(f"ark,scp:{fmllr}/feats.ark,{fmllr}/feats.scp") as wf, \
            kaldiio.WriteHelper(f"ark,scp:{ivec}/ivector_online.ark,"
                                f"{ivec}/ivector_online.scp") as wi:
        for i, utt in enumerate(d.utts):
            n = d.utt2num_frames[utt]
            wf(utt, (rng.normal(size=(n, fmllr_dim)) * 3 - 7).astype(np.float32))
            rows = -(-n // period) + i % 2
            wi(utt, (rng.normal(size=(rows, ivector_dim)) + 2).astype(np.float32))
    (ivec / "ivector_period").write_text(f"{period}\n")
    return {"fmllr": fmllr, "ivector": ivec}


def reference_batches(cs: ChunkSet, seed, rank, world, batch_size, block_utts=256, steps=None):
    """The streaming loader as it was before the resident one (commit e591ba5), kept verbatim
    here as the order both loaders must follow."""
    rng = random.Random(None if seed is None else seed * 7919 + rank)
    utts = cs.shard(seed, rank, world)
    pending = []
    made = 0
    for i in range(0, len(utts), block_utts):
        for u in utts[i: i + block_utts]:
            pending.extend(cs.cut(u))
        if seed is not None:
            rng.shuffle(pending)
        while len(pending) >= batch_size:
            yield cs.collate(pending[:batch_size])
            pending = pending[batch_size:]
            made += 1
            if steps is not None and made >= steps:
                return
    if pending and steps is None:
        yield cs.collate(pending)


def assert_same_batches(want, got, atol: float, rtol: float) -> None:
    want, got = list(want), list(got)
    assert len(got) == len(want)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g.lengths, w.lengths)
        assert torch.equal(g.targets.cpu(), w.targets)
        assert g.feats.dtype == torch.float32 and g.feats.shape == w.feats.shape
        torch.testing.assert_close(g.feats.cpu(), w.feats, atol=atol, rtol=rtol)


@pytest.fixture(scope="module")
def chunk_data(tmp_path_factory) -> tuple[Path, Path]:
    return make_set(tmp_path_factory.mktemp("resident"))


@pytest.fixture(scope="module")
def streams(tmp_path_factory, chunk_data) -> dict[str, Path]:
    """fMLLR features and online i-vectors of ``chunk_data``'s set (a composed input)."""
    return write_streams(tmp_path_factory.mktemp("streams"), chunk_data[0])


@pytest.mark.parametrize("append", [(), ("fmllr",), ("ivector",), ("fmllr", "ivector")])
@pytest.mark.parametrize("delta_order, norm_vars", [(0, True), (2, True), (2, False)])
@pytest.mark.parametrize("seed, world, batch_size, block_utts",
                         [(1, 1, 4, 3), (2, 2, 3, 2), (7, 3, 2, 256), (13, 2, 5, 1)])
def test_resident_equals_streaming_batch_for_batch(chunk_data, streams, append, delta_order,
                                                    norm_vars, seed, world, batch_size,
                                                    block_utts) -> None:
    cs = ChunkSet(*chunk_data, chunk=21, delta_order=delta_order, norm_vars=norm_vars,
                  streams={s: streams[s] for s in append})
    resident = {torch.float32: ResidentChunks(cs, "cpu", torch.float32),
                torch.float16: ResidentChunks(cs, "cpu", torch.float16)}
    steps = cs.steps(seed, world, batch_size)
    for rank in range(world):
        args = (seed, rank, world, batch_size, block_utts, steps)
        assert_same_batches(reference_batches(cs, *args), cs.batches(*args), 0, 0)
        assert_same_batches(reference_batches(cs, *args), resident[torch.float32].batches(*args),
                            atol=1e-5, rtol=1e-5)
        # fp16 storage: the normalised frames rounded to 11 significant bits (Δ/ΔΔ sum them)
        assert_same_batches(reference_batches(cs, *args), resident[torch.float16].batches(*args),
                            atol=4e-3, rtol=2e-3)


@pytest.mark.parametrize("world", [1, 2])
def test_in_order_epoch_keeps_every_chunk_and_the_partial_batch(chunk_data, world) -> None:
    cs = ChunkSet(*chunk_data, chunk=21, delta_order=2, norm_vars=True)
    rc = ResidentChunks(cs, "cpu", torch.float32)
    seen = 0
    for rank in range(world):
        args = (None, rank, world, 4)
        assert_same_batches(reference_batches(cs, *args), rc.batches(*args), 1e-5, 1e-5)
        seen += sum(b.samples for b in rc.batches(*args))
    assert seen == len(cs)


def test_padding_and_short_utterances(tmp_path: Path) -> None:
    """An utterance shorter than a chunk is one chunk: zero features and IGNORE targets past it,
    its Δ/ΔΔ clamped to its own frames (not its neighbours' in the store)."""
    cs = ChunkSet(*make_set(tmp_path, [3, 40, 5]), chunk=21, delta_order=2)
    rc = ResidentChunks(cs, "cpu", torch.float32)
    batches = list(rc.batches(None, 0, 1, 8))
    assert len(batches) == 1 and batches[0].lengths.tolist() == [3, 21, 21, 5]
    b = batches[0]
    for i, utt, start in ((0, cs.utts[0], 0), (2, cs.utts[1], 19), (3, cs.utts[2], 0)):
        n = int(b.lengths[i])
        want = cs.reader[utt][start: start + n]
        torch.testing.assert_close(b.feats[i, :n], torch.from_numpy(want), atol=1e-5, rtol=1e-5)
        assert (b.feats[i, n:] == 0).all() and (b.targets[i, n:] == IGNORE).all()


def test_memory_per_frame_and_refusal(chunk_data) -> None:
    cs = ChunkSet(*chunk_data, chunk=21)
    rc = ResidentChunks(cs, "cpu")
    assert rc.dtype == torch.float16
    assert rc.bytes_per_frame == bytes_per_frame(6, torch.float16, 21) == 6 * 2 + 4 + 32 / 21
    assert rc.nbytes == int((sum(LENGTHS) + 1) * rc.bytes_per_frame)
    assert rc.store_device == torch.device("cpu")
    with pytest.raises(AsrtrainError, match=r"data: 0\.00 GiB of resident chunk data do not fit "
                                            r"in 70% of the 0\.00 GiB .*trainer.chunk_data=stream"):
        ResidentChunks(cs, "cpu", host_bytes=rc.nbytes)
    assert place(100, torch.device("cpu"), "x", host_bytes=1000) == (torch.device("cpu"), False)


def test_placement_on_a_gpu_by_its_free_memory() -> None:
    """The decision a GPU learner takes (its free memory given, so it runs without a GPU):
    the GPU while half its free memory holds the store, then pinned host memory, then no."""
    gpu, cpu, gib = torch.device("cuda", 1), torch.device("cpu"), 1 << 30
    assert place(39 * gib, gpu, "x", host_bytes=100 * gib, gpu_free=80 * gib) == (gpu, False)
    assert place(41 * gib, gpu, "x", host_bytes=100 * gib, gpu_free=80 * gib) == (cpu, True)
    with pytest.raises(AsrtrainError, match=r"^data/train: 71\.00 GiB of resident chunk data do "
                                            r"not fit in 50% of the 80\.00 GiB free on cuda:1, "
                                            r"nor in 70% of the 100\.00 GiB of available host"):
        place(71 * gib, gpu, "data/train", host_bytes=100 * gib, gpu_free=80 * gib)


def test_bad_data_names_file_and_utterance(tmp_path: Path) -> None:
    data, ali = make_set(tmp_path, [30, 40])
    utt = "spk1-u01"
    with kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as wa:
        wa("spk0-u00", np.zeros(30, dtype=np.int32))
        wa(utt, np.zeros(39, dtype=np.int32))
    with pytest.raises(AsrtrainError, match=f"ali.scp: utterance {utt} has 39 frames of "
                                            "alignment for 40"):
        ResidentChunks(ChunkSet(data, ali, chunk=21), "cpu")
    with kaldiio.WriteHelper(f"ark,scp:{ali}/ali.ark,{ali}/ali.scp") as wa:
        wa("spk0-u00", np.zeros(30, dtype=np.int32))
        wa(utt, np.full(40, NUM_PDFS, dtype=np.int32))
    with pytest.raises(AsrtrainError, match=f"utterance {utt} has pdf ids outside"):
        ResidentChunks(ChunkSet(data, ali, chunk=21), "cpu")
    (data / "utt2num_frames").write_text("spk0-u00 30\nspk1-u01 41\n")
    with pytest.raises(AsrtrainError, match=f"utt2num_frames: utterance {utt} has 41 frames, "
                                            "its features 40"):
        ResidentChunks(ChunkSet(data, ali, chunk=21), "cpu")


def test_hybrid_task_trains_on_resident_data_as_on_streamed(tmp_path: Path) -> None:
    """FrameCETask (the trainer's hybrid task) serves the same epochs and dev figures with
    trainer.chunk_data=resident (the default) as with stream."""
    from omegaconf import OmegaConf

    from asrtrain.models import build_model
    from asrtrain.train.tasks import FrameCETask

    _, ali = make_set(tmp_path / "exp", data_dir="data/train")
    tasks = {}
    for mode in ("resident", "stream"):
        cfg = OmegaConf.create({
            "exp_dir": str(tmp_path / "exp"), "features": {"delta_order": 2, "norm_vars": True},
            "trainer": {"chunk": 21, "batch_chunks": 3, "block_utts": 4, "seed": 5, "cpu": True,
                        **({"chunk_data": mode} if mode == "stream" else {})},
            "model": {"head": "ce", "alignments": {"train": str(ali), "dev": str(ali)},
                      "name": "b", "layers": 1, "cells": 8, "bottleneck": 4},
            "sets": {"train": "train", "dev": "train"}})
        tasks[mode] = FrameCETask(cfg)
    assert tasks["resident"].chunk_data == "resident"
    for world in (1, 2):
        for rank in range(world):
            assert_same_batches(tasks["stream"].epoch(2, rank, world),
                                tasks["resident"].epoch(2, rank, world), 4e-3, 2e-3)
    torch.manual_seed(0)
    model = build_model(cfg.model, tasks["stream"].input_dim, tasks["stream"].output_dim)
    sums = {m: t.evaluate(model, 0, 1) for m, t in tasks.items()}
    chunk_frames = int(tasks["stream"].dev_set.chunk_table()[2].sum())  # overlaps counted
    assert sums["resident"]["count"] == sums["stream"]["count"] == chunk_frames
    assert sums["resident"]["loss"] == pytest.approx(sums["stream"]["loss"], rel=1e-4)


def test_values_beyond_fp16_are_refused(tmp_path: Path) -> None:
    data, ali = make_set(tmp_path, [30, 40])
    (data / "cmvn.scp").unlink()  # no CMVN: the stored values as they are
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/big.ark,{tmp_path}/big.scp") as w:
        w("spk1-u01", np.full((40, 6), 1e5, dtype=np.float32))
    scp = (data / "feats.scp").read_text().splitlines()
    (data / "feats.scp").write_text(scp[0] + "\n" + (tmp_path / "big.scp").read_text())
    cs = ChunkSet(data, ali, chunk=21)
    with pytest.raises(AsrtrainError, match=r"feats.scp: feature values up to 100000 .*spk1-u01"
                                            r"\) overflow float16 storage"):
        ResidentChunks(cs, "cpu")
    assert ResidentChunks(cs, "cpu", torch.float32).feats[30:70].eq(1e5).all()


def test_loading_in_blocks_gives_the_same_store(chunk_data, monkeypatch) -> None:
    """Sets bigger than one load block (LOAD_FRAMES) are read and normalised block by block."""
    import asrtrain.train.resident as resident

    cs = ChunkSet(*chunk_data, chunk=21, norm_vars=True)
    whole = ResidentChunks(cs, "cpu", torch.float32)
    monkeypatch.setattr(resident, "LOAD_FRAMES", 50)
    monkeypatch.setattr(resident, "TABLE_UTTS", 2)  # the chunk table two utterances at a time
    blocks = ResidentChunks(cs, "cpu", torch.float32)
    assert torch.equal(blocks.feats, whole.feats) and torch.equal(blocks.targets, whole.targets)
    for name in ("first", "utt_lo", "utt_hi", "length"):
        assert torch.equal(getattr(blocks, name), getattr(whole, name)), name
    assert whole.feats.shape == (sum(LENGTHS) + 1, 6) and (whole.feats[-1] == 0).all()
