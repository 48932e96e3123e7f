"""The align stage run twice from scratch, same settings and ``nj``, gives byte-identical outputs
(issue 26 item 5): every pass's ``final.mdl`` and ``ali.ark`` (mono, tri1, tri3 with LDA+MLLT,
tri4 with SAT), the tree, the phone-state alignment, tri4's transforms and ``final.alimdl``, the
dev set's fMLLR alignment and the fMLLR feature dirs.

The two runs are two processes with different ``PYTHONHASHSEED`` (what two runs of a command
get), in different exp dirs, each from the raw corpus, with ``nj=2`` so that the statistics of
two jobs are summed and their alignment parts merged, and their jobs finish in whatever order
the machine gives them: the first is the session's run of every stage (conftest's tiny_shipped,
hash seed 1; the same align settings), the second this module's (prepare, lang, features, lm,
mfcc, align, fmllr, decode_gmm; hash seed 2).

It fails as it should when the order is a hash's: with ``split_by_speaker`` dealing the
speakers in ``set`` order (a copy of the tree, checked once), every pass's ``final.mdl``,
tri4's transforms and the fMLLR features differed (the statistics of other job splits
summed), the alignments did not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import small  # bench/small.py (conftest puts bench/ on the path)

REPO = Path(__file__).resolve().parents[1]
PASSES = ("mono", "tri1", "tri3", "tri4")
# the small SAT chain (mono -> tri1 -> tri3 -> tri4), without decoding: recipes/tiny/small.yaml
SMALL = ["nj=2", *small.overrides("sat_passes")]
STAGES = "stages=[prepare,lang,features,lm,mfcc,align,fmllr,decode_gmm]"


def start(exp: Path, hash_seed: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.Popen([sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny",
                             f"exp_dir={exp}", STAGES, *SMALL], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 1500) -> None:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_shipped: dict) -> tuple[Path, Path]:
    exp = tmp_path_factory.mktemp("repro") / "two" / "exp"
    proc = start(exp, "2")
    try:
        finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return tiny_shipped["exp"], exp


def outputs(exp: Path) -> list[str]:
    """The files compared: every pass's model, tree and alignments, tri4's transforms and
    alignment model, the dev set's alignment with tri4, and the fMLLR features."""
    align = exp / "align"
    names = [f"{p}/{f}" for p in PASSES
             for f in ("final.mdl", "ali.ark", "ali_phone_state.ark", "tree.txt", "num_pdfs")]
    names += ["tri4/trans.ark", "tri4/final.alimdl"]
    names += [f"tri4_ali_train_dev/{f}" for f in ("ali.ark", "ali_phone_state.ark", "trans.ark")]
    for name in names:
        assert (align / name).is_file(), f"{align / name}: missing"
    fmllr = sorted(str(p.relative_to(exp)) for p in (exp / "data").glob("*_fmllr/*.ark"))
    assert len(fmllr) >= 3, fmllr                 # train, dev and test sets' features
    return [f"align/{n}" for n in names] + fmllr


def test_two_runs_from_scratch_give_the_same_bytes(runs: tuple[Path, Path]) -> None:
    one, two = runs
    for stage in ("mfcc", "align", "fmllr"):  # the same settings (digests are each run's own)
        config = [json.loads((e / ".done" / stage).read_text())["config"] for e in runs]
        assert config[0] == config[1], stage
    names = outputs(one)
    assert outputs(two) == names
    differ = [n for n in names if (one / n).read_bytes() != (two / n).read_bytes()]
    assert not differ, f"differ between the two runs: {differ}"


def test_the_runs_did_train_every_pass(runs: tuple[Path, Path]) -> None:
    """The comparison is of real models: tri3 has its LDA+MLLT matrix, tri4 is SAT, and every
    pass's tree has the leaves asked for (the small settings' 80 at tri3 and tri4)."""
    from asrtrain.align.model import AcousticModel

    one, _ = runs
    assert AcousticModel.load(one / "align" / "tri3").kind == "lda_mllt"
    assert AcousticModel.load(one / "align" / "tri4").kind == "sat"
    for name in ("tri3", "tri4"):
        assert int((one / "align" / name / "num_pdfs").read_text().split()[0]) > 40
