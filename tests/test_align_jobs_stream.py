"""A GMM pass's jobs stream their part a batch of whole speakers at a time (issue 22: a job's
memory is the model, the statistics and one batch, not its part's features): with one speaker
per batch the passes give the same bytes as with the whole part in one batch — alignments,
trees, models, transforms and ``final.alimdl`` exactly equal, not to a tolerance — because
every statistic runs through the batches in the part's order into one accumulator.

The corpus and lang are session fixtures of tests/conftest.py (4 voices as 4 speakers of 12
training utterances each). The tri2, tri3 and tri4 passes (tree, LDA, MLLT, fMLLR, GMM and
final.alimdl statistics, realignments) and tri4's align_fmllr, streamed a speaker at a time, are
compared in test_align_adapt's test_results_do_not_depend_on_nj_or_batches, whose 2-job run
streams them (the same bytes as its 1- and 3-job runs of whole parts).
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import numpy as np
import pytest
import torch

from asrtrain.align.model import AcousticModel
from asrtrain.align.passjobs import Part
from asrtrain.data.datadir import DataDir
from asrtrain.jobs import split_by_speaker
from asrtrain.lang.lexicon import Lang

pytestmark = pytest.mark.timeout(1800)


def _same_bytes(a: Path, b: Path, names: list[str]) -> None:
    for name in names:
        if name.endswith(".scp"):   # offsets into the same bytes, paths of their own dirs
            assert a.joinpath(name).read_text().replace(str(a.resolve()), "") == \
                b.joinpath(name).read_text().replace(str(b.resolve()), ""), name
        else:
            assert filecmp.cmp(a / name, b / name, shallow=False), name


def _equal_models(one: AcousticModel, two: AcousticModel) -> None:
    for name in ("means", "vars", "log_weights"):
        assert torch.equal(getattr(one.gmm, name), getattr(two.gmm, name)), name
    assert np.array_equal(one.var_floor, two.var_floor)
    assert sorted(one.log_trans) == sorted(two.log_trans)
    for p in one.log_trans:
        assert np.array_equal(one.log_trans[p], two.log_trans[p]), p
    assert (one.lda_mllt is None) == (two.lda_mllt is None)
    if one.lda_mllt is not None:
        assert np.array_equal(one.lda_mllt, two.lda_mllt)


def test_batches_are_whole_speakers_in_the_parts_order(corpus, tmp_path) -> None:
    data = DataDir.read(corpus["train"])
    spk2utt: dict[str, list[str]] = {}
    for u in data.utts:
        spk2utt.setdefault(data.utt2spk[u], []).append(u)
    lang = Lang.read(corpus["lang"])
    for utts in split_by_speaker(spk2utt, 2):
        part = Part(1, str(corpus["train"]), str(corpus["lang"]), utts, str(tmp_path))
        whole = list(part.batches(lang, 0))
        assert len(whole) == 1 and [u.utt for u in whole[0]] == utts
        for size in (1, 500):
            batches = list(part.batches(lang, size))
            assert [u.utt for b in batches for u in b] == utts
            speakers = [{u.speaker for u in b} for b in batches]
            assert len(set().union(*speakers)) == sum(map(len, speakers))   # none split
            assert all(sum(len(u.feats) for u in b) >= size for b in batches[:-1])
            got = {u.utt: u.feats for u in whole[0]}
            assert all(np.array_equal(u.feats, got[u.utt]) for b in batches for u in b)
        assert len(list(part.batches(lang, 1))) == len({data.utt2spk[u] for u in utts})


def test_a_job_reads_its_blocks_tables_only(corpus, tmp_path) -> None:
    """A pass's jobs are the data dir's blocks (``split<N>/<k>``, whatever nj), each reading
    its own block's data dir; a worker that serves several blocks keeps the tables of the
    block it works on, not of each block it served."""
    from asrtrain.align.config import GmmConfig
    from asrtrain.align.passes import PassJobs
    from asrtrain.align.passjobs import _CACHE
    from asrtrain.jobs import JobConfig

    data = DataDir.read(corpus["train"])
    lang = Lang.read(corpus["lang"])
    parts = {}
    for nj in (1, 3):
        with PassJobs(corpus["train"], corpus["lang"], tmp_path / f"nj{nj}", data.utts, data,
                      JobConfig(nj=nj), GmmConfig(), "test") as pj:
            parts[nj] = [(p.index, p.data_dir, p.utts) for p in pj.parts]
            if nj == 3:
                for p in pj.parts:
                    block = DataDir.read(p.data_dir)
                    assert Path(p.data_dir).parent.name.startswith("split")
                    assert sorted(block.utt2spk) == sorted(p.utts)
                    assert set(block.feats) == set(p.utts)   # its feature index only
                    assert [u.utt for b in p.batches(lang, 0) for u in b] == p.utts
                    readers = [k for k in _CACHE if k[0] == str(pj.work) and k[1] == "mfcc"]
                    assert readers == [(str(pj.work), "mfcc", p.data_dir)]
    assert parts[1] == parts[3] and len(parts[1]) == len(data.spk2utt)   # 4 speakers: 4 blocks
    assert sorted(u for _, _, us in parts[1] for u in us) == data.utts


def test_mono_streamed_gives_the_same_bytes(corpus, tmp_path) -> None:
    from test_align import MONO

    from asrtrain.align.train import train_mono

    whole, streamed = tmp_path / "whole", tmp_path / "streamed"
    cfg = dict(MONO, num_iters=3, realign_iters=[1, 3], nj=2)
    train_mono(corpus["train"], corpus["lang"], whole, dict(cfg, part_batch_frames=10 ** 9))
    train_mono(corpus["train"], corpus["lang"], streamed, dict(cfg, part_batch_frames=1))
    _same_bytes(whole, streamed, ["ali.ark", "ali_phone_state.ark", "tree.txt"])
    _equal_models(AcousticModel.load(whole), AcousticModel.load(streamed))
