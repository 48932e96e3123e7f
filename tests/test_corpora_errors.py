"""Bad corpus input: every error names the file (and line) at fault and the layout expected."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from asrtrain import AsrtrainError
from asrtrain.data.corpora.datadir import prepare_datadir
from asrtrain.data.corpora.eval2000 import prepare_eval2000
from asrtrain.data.corpora.fisher import prepare_fisher
from asrtrain.data.corpora.swbd import prepare_swbd

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "corpora"
SWBD = FIXTURES / "swbd"
EVAL2000 = FIXTURES / "eval2000"
FISHER = FIXTURES / "fisher"
FISHER_PARTS = ("LDC2004T19", "LDC2005T19", "LDC2004S13", "LDC2005S13")


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def _swbd(root: Path, **kw):
    return prepare_swbd(root / "LDC97S62", root, **{"dev_utts": 2, "max_dup": 3,
                                                    "max_missing_audio": 0, **kw})


# ------------------------------------------------------------------------------ Switchboard
def test_swbd_missing_audio_dir(tmp_path):
    with pytest.raises(AsrtrainError, match=r"nothere: Switchboard audio directory not found; "
                                            r"expected LDC97S62"):
        prepare_swbd(tmp_path / "nothere", SWBD)


def test_swbd_transcripts_given_for_audio():
    with pytest.raises(AsrtrainError, match="swb_ms98_transcriptions: holds the ms98 "
                                            "transcripts, not the audio; expected LDC97S62"):
        prepare_swbd(SWBD / "swb_ms98_transcriptions", SWBD)


def test_swbd_audio_given_for_transcripts():
    with pytest.raises(AsrtrainError, match=r"LDC97S62: no sw-ms98-dict.text \(this looks like "
                                            r"the audio, LDC97S62, given for the transcripts\)"):
        prepare_swbd(SWBD / "LDC97S62", SWBD / "LDC97S62")


def test_swbd_malformed_transcript_line(tmp_path):
    root = _copy(SWBD, tmp_path)
    f = root / "swb_ms98_transcriptions/20/2005/sw2005A-ms98-a-trans.text"
    f.write_text(f.read_text() + "sw2005A-ms98-a-0004 0.79 oops\n")
    with pytest.raises(AsrtrainError, match=r"sw2005A-ms98-a-trans.text:4: expected "
                                            r"'<swNNNN\[AB\]-ms98-a-NNNN> <start> <end>"):
        _swbd(root)


def test_swbd_backwards_times(tmp_path):
    root = _copy(SWBD, tmp_path)
    f = root / "swb_ms98_transcriptions/20/2005/sw2005A-ms98-a-trans.text"
    f.write_text(f.read_text().replace("0.155000 0.404999", "0.455000 0.404999"))
    with pytest.raises(AsrtrainError, match=r"sw2005A-ms98-a-trans.text:2: start 0.455000 after"):
        _swbd(root)


def test_swbd_empty_transcript_file(tmp_path):
    root = _copy(SWBD, tmp_path)
    (root / "swb_ms98_transcriptions/20/2005/sw2005B-ms98-a-trans.text").write_text("")
    with pytest.raises(AsrtrainError, match="sw2005B-ms98-a-trans.text: empty transcript file"):
        _swbd(root)


def test_swbd_transcripts_without_audio(tmp_path):
    root = _copy(SWBD, tmp_path)
    (root / "LDC97S62/swb1_d2/data/sw02005.sph").unlink()
    with pytest.raises(AsrtrainError, match=r"sw2005A-ms98-a-trans.text:1: conversation sw02005 "
                                            r"has transcripts but no audio sw02005.sph"):
        _swbd(root)
    # Real LDC97S62 copies miss up to 3 of the transcribed calls; Kaldi then drops them.
    corpus = _swbd(root, max_missing_audio=3)
    assert sorted(corpus.sets["train"].wav) == ["sw02001-A", "sw02001-B"]


def test_swbd_malformed_lexicon_line(tmp_path):
    root = _copy(SWBD, tmp_path)
    f = root / "swb_ms98_transcriptions/sw-ms98-dict.text"
    f.write_text(f.read_text() + "lonely\n")
    with pytest.raises(AsrtrainError, match=r"sw-ms98-dict.text:28: expected '<word> "
                                            r"<phones...>', got 'lonely'"):
        _swbd(root)


def test_swbd_not_utf8(tmp_path):
    root = _copy(SWBD, tmp_path)
    f = root / "swb_ms98_transcriptions/20/2001/sw2001B-ms98-a-trans.text"
    f.write_bytes(f.read_bytes().replace(b"yeah", b"y\xe9ah"))
    with pytest.raises(AsrtrainError, match="sw2001B-ms98-a-trans.text:5: not UTF-8"):
        _swbd(root)


def test_swbd_too_few_for_dev():
    with pytest.raises(AsrtrainError, match="15 utterances, too few to hold out dev_utts=4000"):
        prepare_swbd(SWBD / "LDC97S62", SWBD, dev_utts=4000, max_missing_audio=0)


# ------------------------------------------------------------------------------ eval2000
def test_eval2000_missing_and_swapped_dirs(tmp_path):
    with pytest.raises(AsrtrainError, match="nothere: Hub5'00 audio directory not found; "
                                            "expected LDC2002S09"):
        prepare_eval2000(tmp_path / "nothere", EVAL2000 / "LDC2002T43")
    with pytest.raises(AsrtrainError, match=r"english: not found \(this looks like the "
                                            r"transcripts, LDC2002T43, given for the audio\)"):
        prepare_eval2000(EVAL2000 / "LDC2002T43/2000_hub5_eng_eval_tr", EVAL2000 / "LDC2002T43")
    with pytest.raises(AsrtrainError, match=r"reference: not found \(this looks like the audio, "
                                            r"LDC2002S09, given for the transcripts\)"):
        prepare_eval2000(EVAL2000 / "LDC2002S09", EVAL2000 / "LDC2002S09")


def test_eval2000_missing_stm(tmp_path):
    root = _copy(EVAL2000, tmp_path)
    (root / "LDC2002T43/2000_hub5_eng_eval_tr/reference/hub5e00.english.000405.stm").unlink()
    with pytest.raises(AsrtrainError, match=r"hub5e00.english.000405.stm: not found; "
                                            r"expected LDC2002T43"):
        prepare_eval2000(root / "LDC2002S09", root / "LDC2002T43", expected_sides=4)


def test_eval2000_malformed_pem_and_stm_lines(tmp_path):
    root = _copy(EVAL2000, tmp_path)
    pem = root / "LDC2002S09/hub5e_00/english/hub5e_00.pem"
    good = pem.read_text()
    pem.write_text(good + "en_4156 C unknown_speaker 0.1 0.2\n")
    with pytest.raises(AsrtrainError, match=r"hub5e_00.pem:12: expected '<conversation> <A\|B>"):
        prepare_eval2000(root / "LDC2002S09", root / "LDC2002T43", expected_sides=4)
    pem.write_text(good)
    stm = root / "LDC2002T43/2000_hub5_eng_eval_tr/reference/hub5e00.english.000405.stm"
    stm.write_text(stm.read_text() + "sw_4390 B sw_4390_B 0.40 x <O,sw,M,sw-M> YEAH\n")
    with pytest.raises(AsrtrainError, match=r"hub5e00.english.000405.stm:15: expected"):
        prepare_eval2000(root / "LDC2002S09", root / "LDC2002T43", expected_sides=4)


def test_eval2000_stm_and_pem_disagree(tmp_path):
    root = _copy(EVAL2000, tmp_path)
    stm = root / "LDC2002T43/2000_hub5_eng_eval_tr/reference/hub5e00.english.000405.stm"
    stm.write_text(stm.read_text() + "sw_4390 B sw_4390_B 0.80 0.90 <O,sw,M,sw-M> RIGHT\n")
    with pytest.raises(AsrtrainError, match=r"stm:15: utterance sw_4390-B_000080-000090 has no "
                                            r"segment in .*hub5e_00.pem"):
        prepare_eval2000(root / "LDC2002S09", root / "LDC2002T43", expected_sides=4)


def test_eval2000_segments_without_audio(tmp_path):
    root = _copy(EVAL2000, tmp_path)
    (root / "LDC2002S09/hub5e_00/english/sw_4390.sph").unlink()
    with pytest.raises(AsrtrainError, match=r"hub5e_00.pem: conversation sw_4390 has segments "
                                            r"but no audio sw_4390.sph"):
        prepare_eval2000(root / "LDC2002S09", root / "LDC2002T43", expected_sides=4)


def test_eval2000_side_count():
    with pytest.raises(AsrtrainError, match=r"english: 4 conversation sides with scored "
                                            r"segments, expected 80"):
        prepare_eval2000(EVAL2000 / "LDC2002S09", EVAL2000 / "LDC2002T43")


# ------------------------------------------------------------------------------ Fisher
def _fisher_copy(tmp_path: Path) -> list[Path]:
    return [_copy(FISHER / part, tmp_path) for part in FISHER_PARTS]


def test_fisher_missing_subdirectory(tmp_path):
    dirs = _fisher_copy(tmp_path)
    shutil.rmtree(dirs[2] / "fe_03_p1_sph4")
    with pytest.raises(AsrtrainError, match="could not find the subdirectory fe_03_p1_sph4"):
        prepare_fisher(dirs, expected_conversations=2)


def test_fisher_bad_header_and_line(tmp_path):
    dirs = _fisher_copy(tmp_path)
    f = dirs[0] / "fe_03_p1_tran/data/trans/000/fe_03_00001.txt"
    good = f.read_text()
    f.write_text(good.replace("# fe_03_00001.sph", "# fe_03_00002.sph"))
    with pytest.raises(AsrtrainError, match=r"fe_03_00001.txt:1: header names fe_03_00002.sph"):
        prepare_fisher(dirs, expected_conversations=2)
    f.write_text(good + "0.80 A so long\n")
    with pytest.raises(AsrtrainError, match=r"fe_03_00001.txt:10: expected '<start> <end> "
                                            r"<A\|B>: <words>', got '0.80 A so long'"):
        prepare_fisher(dirs, expected_conversations=2)


def test_fisher_counts_and_missing_audio(tmp_path):
    dirs = _fisher_copy(tmp_path)
    with pytest.raises(AsrtrainError, match="expected to find 11699 transcript files in the "
                                            "Fisher data .* found 2"):
        prepare_fisher(dirs)
    (dirs[3] / "fisher_eng_tr_sp_d1/audio/058/fe_03_05851.sph").unlink()
    with pytest.raises(AsrtrainError, match=r"fe_03_05851.txt:5: conversation fe_03_05851 has "
                                            r"transcripts but no audio"):
        prepare_fisher(dirs, expected_conversations=None)


# ------------------------------------------------------------------------------ datadir
def _user_dir(tmp_path: Path, rate: int) -> Path:
    d = tmp_path / "mine"
    d.mkdir()
    soundfile.write(d / "rec1.wav", np.zeros(rate // 2, dtype=np.int16), rate)
    (d / "wav.scp").write_text(f"rec1 {d / 'rec1.wav'}\n")
    (d / "segments").write_text("spk1-u1 rec1 0.0 0.2\nspk1-u2 rec1 0.2 0.4\n")
    (d / "text").write_text("spk1-u1 hello\nspk1-u2 world\n")
    (d / "utt2spk").write_text("spk1-u1 spk1\nspk1-u2 spk1\n")
    return d


def test_datadir_wrong_rate_missing_audio_missing_text(tmp_path):
    d = _user_dir(tmp_path, 16000)
    with pytest.raises(AsrtrainError, match=r"mine/wav.scp:1: recording rec1 is at 16000 Hz, "
                                            r"expected 8000 Hz"):
        prepare_datadir({"train": d}, sample_rate=8000, resample=False)
    assert prepare_datadir({"train": d}, sample_rate=8000, resample=True).sets["train"].utts == [
        "spk1-u1", "spk1-u2"]
    (d / "rec1.wav").unlink()
    with pytest.raises(AsrtrainError, match=r"rec1.wav: audio file not found"):
        prepare_datadir({"train": d}, sample_rate=8000)
    (d / "text").unlink()
    with pytest.raises(AsrtrainError, match=r"mine/text: missing"):
        prepare_datadir({"train": d}, sample_rate=8000)


def test_datadir_bad_tables(tmp_path):
    d = _user_dir(tmp_path, 8000)
    (d / "utt2spk").write_text("spk1-u1 spk1\nspk1-u2 spk1\nspk1-u3 spk1\n")
    with pytest.raises(AsrtrainError, match=r"mine/utt2spk:3: utterance spk1-u3 has no transcript"):
        prepare_datadir({"train": d}, sample_rate=8000)
    with pytest.raises(AsrtrainError, match=r"notadir: data dir for set dev not found"):
        prepare_datadir({"dev": tmp_path / "notadir"}, sample_rate=8000)
    with pytest.raises(AsrtrainError, match=r"dict: not a Kaldi dict dir, missing lexicon.txt"):
        (d / "utt2spk").write_text("spk1-u1 spk1\nspk1-u2 spk1\n")
        prepare_datadir({"train": d}, sample_rate=8000, dict_dir=tmp_path / "dict")
