"""Scale corpora from data/tiny/make_tiny.py --hours: the LDC layouts at any size, read by the
real Switchboard and eval2000 preparers through the tiny recipe's prepare stage."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
MAKE = REPO / "data" / "tiny" / "make_tiny.py"
HOURS, TEST_HOURS = 0.05, 0.03
pytestmark = pytest.mark.skipif(not (shutil.which("espeak-ng") and shutil.which("sox")),
                                reason="the generator needs Debian espeak-ng and sox")


def make(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(MAKE), "--out", str(out), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def generate(out: Path, jobs: int) -> Path:
    proc = make(out, "--hours", str(HOURS), "--test-hours", str(TEST_HOURS), "--speakers", "3",
                "--vocab", "600", "--jobs", str(jobs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("scale") / "corpus", jobs=2)


def manifest(corpus: Path) -> dict:
    return json.loads((corpus / "corpus.json").read_text())


def test_scale_corpus_has_the_ldc_layouts_and_the_amount_asked(corpus: Path) -> None:
    m = manifest(corpus)
    assert abs(m["train"]["speech_hours"] - HOURS) < 0.2 * HOURS, m["train"]
    assert abs(m["test"]["speech_hours"] - TEST_HOURS) < 0.3 * TEST_HOURS, m["test"]
    train_sph = sorted((corpus / "LDC97S62").glob("swb1_d*/data/sw0*.sph"))
    assert len(train_sph) == m["train"]["conversations"] >= 2
    ms98 = corpus / "LDC97S62" / "swb_ms98_transcriptions"
    for sph in train_sph:
        num = int(sph.stem[2:])
        for side in "AB":
            assert (ms98 / f"{num // 100:02d}" / f"{num:04d}" /
                    f"sw{num}{side}-ms98-a-trans.text").is_file()
    assert (ms98 / "sw-ms98-dict.text").is_file()
    test_sph = sorted((corpus / "LDC2002S09" / "hub5e_00" / "english").glob("*.sph"))
    assert {p.stem[:3] for p in test_sph} == {"sw_", "en_"}
    assert len(test_sph) == m["test"]["conversations"]
    for sph in train_sph + test_sph:
        info = sf.info(str(sph))
        assert (info.samplerate, info.channels, info.subtype) == (8000, 2, "ULAW"), sph
    ref = corpus / "LDC2002T43" / "reference"
    for name in ("hub5e00.english.000405.stm", "en20000405_hub5.glm"):
        assert (ref / name).is_file()
    assert {p.stem for p in (ref / "english").glob("*.txt")} == {p.stem for p in test_sph}


def test_prepare_stage_reads_it_with_the_expected_segments_and_hours(corpus: Path,
                                                                      tmp_path: Path) -> None:
    m = manifest(corpus)
    exp = tmp_path / "exp"
    proc = forked_cli.run("run", "recipes/tiny", f"exp_dir={exp}", f"corpus.root={corpus}",
                          f"corpus.expected_test_sides={m['test']['sides']}",
                          "corpus.dev_utts=5", "--to", "prepare", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = (exp / "data" / "train" / "segments").read_text().splitlines()
    test = (exp / "data" / "eval2000" / "segments").read_text().splitlines()
    assert len(train) == m["train"]["segments"]
    assert len(test) == m["test"]["scored_segments"]
    hours = sum(float(e) - float(s) for _u, _r, s, e in map(str.split, train)) / 3600
    # ms98 segments are the turns padded by 0.05 s on each side
    pad = 0.1 * len(train) / 3600
    assert m["train"]["speech_hours"] <= hours <= m["train"]["speech_hours"] + pad + 1e-6
    assert len((exp / "data" / "train_dev" / "segments").read_text().splitlines()) == 5


def test_scale_corpus_is_the_same_on_one_worker(corpus: Path, tmp_path: Path) -> None:
    again = generate(tmp_path / "again", jobs=1)
    cmp = filecmp.dircmp(corpus, again)
    differing = []

    def walk(c: filecmp.dircmp) -> None:
        differing.extend(c.left_only + c.right_only)
        _match, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files,
                                                    shallow=False)
        differing.extend(mismatch + errors)
        for sub in c.subdirs.values():
            walk(sub)

    walk(cmp)
    assert not differing


def test_bad_size_is_refused(tmp_path: Path) -> None:
    proc = make(tmp_path / "c", "--hours", "0")
    assert proc.returncode == 2 and "--hours must be positive" in proc.stderr
    assert not (tmp_path / "c").exists()
