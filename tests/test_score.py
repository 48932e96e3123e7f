"""Unit tests of the Hub5 scorer: GLM rules, csrfilt steps, sclite's DP, segments, reports, CLI.

Where SCTK behaviour is the reference (csrfilt.sh, sclite boundaries), the tests run SCTK on the
same small files and fail if it is not installed.
"""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from asrtrain import AsrtrainError
from asrtrain.cli import main
from asrtrain.score import counts_json, report_wer, score_decode, score_hub5, wer_counts
from asrtrain.score.align import Counts, align_words
from asrtrain.score.command import score_command
from asrtrain.score.ctm import filter_ctm, kaldi_keep, read_ctm, sort_ctm
from asrtrain.score.glm import Glm, check_optional_parens, csr_filter_text
from asrtrain.score.hub5 import score_hub5_python
from asrtrain.score.sclite import run_hubscr, sctk_bin
from asrtrain.score.stm import fix_eval2000_stm_line, read_stm

GLM = Path(__file__).resolve().parent / "fixtures" / "glm" / "en20030506.glm"   # see its README
HEADER = ';; LABEL "O" "Overall" "Overall"\n'


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _ops(ref: str, hyp: str) -> str:
    return " ".join(p.op for p in align_words(ref.split(), hyp.split()))


# ---------------------------------------------------------------- GLM rules


def test_glm_rule_parsing(tmp_path: Path) -> None:
    glm = _write(tmp_path / "t.glm", ";; test\n* format = 'NIST1'\n* case_sensitive = 'F'\n"
                 "HUH-UH  =>  %BCNACK    / [ ] __ [ ] ;; negative token\n"
                 "GONNA => GOING TO ;; no context\n"
                 "[CAN'T] => [{CAN NOT / CANNOT}] / [ ] __ [ ]\n"
                 "BINYAMIN => BENJAMIN / __ [ NETANYAHU]\n"
                 "ADVISER => ADVISOR / [ ] __  ;; left context only\n")
    rules = Glm.load(glm).rules
    assert [(r.source, r.target, r.left, r.right) for r in rules] == [
        ("HUH-UH", "%BCNACK", " ", " "),
        ("GONNA", "GOING TO", "", ""),
        ("CAN'T", "{CAN NOT / CANNOT}", " ", " "),
        ("BINYAMIN", "BENJAMIN", "", " NETANYAHU"),
        ("ADVISER", "ADVISOR", " ", ""),
    ]


def test_glm_rewrite_is_character_level_and_context_sensitive(tmp_path: Path) -> None:
    glm = Glm.load(_write(tmp_path / "t.glm", ";; t\n* case_sensitive = 'F'\n"
                          "UH => %HESITATION / [ ] __ [ ]\n"
                          "GONNA => GOING TO\n"
                          "ADVISER => ADVISOR / [ ] __\n"
                          "AB => X\nA => Y\n"))
    # whole words only where the rule has [ ] contexts; contexts are read from the input
    assert glm.rewrite(" UH UH UHM HUH ") == " %HESITATION %HESITATION UHM HUH "
    assert glm.rewrite(" GONNAS ") == " GOING TOS "  # no context: matches inside words
    assert glm.rewrite(" ADVISERS ") == " ADVISORS "
    assert glm.rewrite(" ab a ") == " X Y "  # first rule in file order wins; case-insensitive


def test_glm_input_dependent_sections() -> None:
    ref = Glm.load(GLM, "stm", "ref")
    hyp = Glm.load(GLM, "ctm", "hyp")
    assert csr_filter_text(" he's gonna uh-huh ", ref) == "HE'S GOING TO %BCACK"
    assert csr_filter_text("he's", hyp) == "{HE IS / HE HAS}"
    assert csr_filter_text("can't", hyp) == "{CAN NOT / CANNOT}"


def test_csrfilt_steps() -> None:
    ref = Glm.load(GLM, "stm", "ref")
    # optional words keep their parentheses, spread over every word; hyphens split words but
    # not fragments; everything upper case
    assert csr_filter_text(" (uh) (gonna) x-ray fine- -ing (th-) ", ref) == (
        "(%HESITATION) (GOING) (TO) X RAY FINE- -ING (TH-)"
    )
    assert check_optional_parens("i (uh) am")
    assert not check_optional_parens("i ((uh) am")
    assert not check_optional_parens("i (uh am")


def test_glm_filter_equals_csrfilt_on_random_lines(tmp_path: Path) -> None:
    bindir = sctk_bin()
    ref = Glm.load(GLM, "stm", "ref")
    hyp = Glm.load(GLM, "ctm", "hyp")
    pool = [r.source for r in hyp.rules] + ["hello", "x-ray", "(uh)", "-ing", "th-", "Mm-Hmm",
                                             "binyamin netanyahu", "t. shirt", "good by", "adviser"]
    rng = random.Random(7)
    texts = [" ".join(rng.choice(pool).lower() if rng.random() < 0.5 else rng.choice(pool)
                      for _ in range(rng.randint(0, 6))) for _ in range(300)]
    stm = _write(tmp_path / "r.stm", "".join(f"sw_1 A s {i}.0 {i}.5 <O> {t}\n"
                                            for i, t in enumerate(texts)))
    words = [rng.choice(pool).split()[0] for _ in range(300)]
    ctm = _write(tmp_path / "h.ctm", "".join(f"sw_1 A {i}.0 0.5 {w}{' 0.7' if i % 2 else ''}\n"
                                            for i, w in enumerate(words)))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")

    def csrfilt(kind: str, purpose: str, path: Path) -> list[str]:
        cmd = f"csrfilt.sh -i {kind} -t {purpose} -dh {GLM} < {path}"
        return subprocess.run(cmd, shell=True, env=env, capture_output=True, text=True,
                              check=True, timeout=60).stdout.splitlines()

    want = [" ".join(line.split()[6:]) for line in csrfilt("stm", "ref", stm)]
    got = [csr_filter_text(" " + t + " ", ref) for t in texts]
    assert got == want
    assert filter_ctm(sort_ctm(read_ctm(ctm)), hyp) == csrfilt("ctm", "hyp", ctm)


# ---------------------------------------------------------------- alignment


def test_costs_and_ties() -> None:
    assert _ops("a b c", "a x c") == "C S C"
    assert _ops("a b c", "a c") == "C D C"
    assert _ops("a c", "a b c") == "C I C"
    # sclite prefers substitution, then deletion, on equal cost, as in its .pra output
    assert _ops("hello there %hesitation how", "hello their how") == "C D S C"
    assert _ops("", "") == ""


def test_optional_words() -> None:
    # a deleted optional word is correct (and counted as a reference word), a wrong one is a sub
    assert _ops("i (%hesitation) am", "i am") == "C C C"
    assert _ops("i (%hesitation) am", "i %hesitation am") == "C C C"
    assert _ops("i (%hesitation) am", "i uh am") == "C S C"
    c = wer_counts({"u": "i (%hesitation) am".split()}, {"u": "i am".split()})
    assert (c.corr, c.ref_words, c.err) == (3, 3, 0)


def test_fragments() -> None:
    assert _ops("fine- thanks", "finer thanks") == "C C"
    assert _ops("-ing", "going") == "C"
    assert _ops("th-", "a") == "S"
    assert _ops("(th-)", "the") == "C"
    assert _ops("(th-)", "") == "C"


def test_alternations() -> None:
    # hypothesis contraction expansions: the best alternative is chosen
    assert _ops("he is going", "{ he is / he has } going") == "C C C"
    assert _ops("he has", "{ he is / he has }") == "C C"
    assert _ops("cannot", "{ can not / cannot }") == "C"
    assert _ops("x", "{ a / }") == "D"  # deleting x and skipping the null @ is cheapest


def test_wer_counts() -> None:
    c = wer_counts({"a": ["x", "y", "z"], "b": ["p"]}, {"a": ["x", "z", "w"]})
    assert (c.corr, c.sub, c.dels, c.ins, c.segments, c.sent_err) == (2, 0, 2, 1, 2, 2)
    assert c.wer == pytest.approx(75.0)
    with pytest.raises(AsrtrainError, match="no reference"):
        wer_counts({"a": ["x"]}, {"zz": ["x"]})


# ---------------------------------------------------------------- Hub5 segments


def test_ignore_regions_and_segment_assignment(tmp_path: Path) -> None:
    stm = _write(tmp_path / "r.stm", HEADER +
                 "sw_1 A s1 0.00 2.00 <O> a b\n"
                 "sw_1 A s1 2.00 4.00 <O> IGNORE_TIME_SEGMENT_IN_SCORING\n"
                 "sw_1 A s1 4.00 6.00 <O> c d\n"
                 "en_2 B s2 0.00 2.00 <O> e\n")
    ctm = _write(tmp_path / "h.ctm",
                 "sw_1 A 0.10 0.20 a\nsw_1 A 1.00 0.20 b\n"
                 "sw_1 A 2.50 0.20 zz\nsw_1 A 3.50 0.20 yy\n"  # inside the ignored region
                 "sw_1 A 4.50 0.20 c\nsw_1 A 9.00 0.50 d\n"  # after the last segment: kept
                 "en_2 B 0.50 0.20 e\n")
    res = score_hub5_python(stm, ctm, GLM, kaldi_filter=False)
    assert res["all"].total.as_dict() == {"corr": 5, "sub": 0, "dels": 0, "ins": 0, "err": 0,
                                          "ref_words": 5, "segments": 3, "sent_err": 0}
    assert res["swbd"].total.ref_words == 4
    assert res["callhm"].total.ref_words == 1


def test_segment_boundaries_equal_sclite(tmp_path: Path) -> None:
    # sclite keeps STM times in single precision: a word whose midpoint equals the segment end
    # lands on either side depending on how the end time rounds to a float.
    lines, ctm = [HEADER.strip()], []
    for i, t2 in enumerate([1.1, 1.3, 2.3, 11.34, 5.7, 6.9, 7.77, 3.33]):
        lines += [f"sw_{i} A s{i} 0.00 {t2:.2f} a b", f"sw_{i} A s{i} {t2:.2f} 20.00 c d"]
        ctm.append(f"sw_{i} A {t2 - 0.2:.2f} 0.40 b")
    stm = _write(tmp_path / "r.stm", "\n".join(lines) + "\n")
    hyp = _write(tmp_path / "h.ctm", "\n".join(ctm) + "\n")
    speakers, total = run_hubscr(stm, hyp, GLM, tmp_path / "sc", "h.ctm")
    ours = score_hub5_python(stm, hyp, GLM, kaldi_filter=False)["all"]
    assert {k: v.as_dict() for k, v in ours.speakers.items()} == {
        k: v.as_dict() for k, v in speakers.items()}
    assert ours.total.as_dict() == total.as_dict()
    assert total.corr == 3  # three of the eight words stay in the first segment


def test_kaldi_filter() -> None:
    assert not kaldi_keep("sw_1 A 1.0 0.2 [noise]")
    assert not kaldi_keep("sw_1 A 1.0 0.2 [laughter]")
    assert not kaldi_keep("sw_1 A 1.0 0.2 <unk>")
    assert not kaldi_keep("sw_1 A 1.0 0.2 uh")
    assert not kaldi_keep("sw_1 A 1.0 0.2 HM")
    assert not kaldi_keep("sw_1 A 1.0 0.2 some-")
    assert kaldi_keep("sw_1 A 1.0 0.2 uh 0.9")  # Kaldi's grep only sees the end of the line
    assert kaldi_keep("sw_1 A 1.0 0.2 uhm")
    assert kaldi_keep("sw_1 A 1.0 0.2 x-ray")


def test_eval2000_stm_fix() -> None:
    line = "en_1 A en_1_A 1.00 2.00 <O> <B_ASIDE> hold on <E_ASIDE> ((uh) well"
    assert fix_eval2000_stm_line(line) == "en_1 A en_1_A 1.00 2.00 <O>  hold on  (uh) well"


# ---------------------------------------------------------------- errors


def test_malformed_lines_name_file_and_line(tmp_path: Path) -> None:
    stm = _write(tmp_path / "r.stm", HEADER + "sw_1 A s1 0.00 2.00 <O> a\nsw_1 A s1 oops\n")
    with pytest.raises(AsrtrainError, match=r"r\.stm:3"):
        read_stm(stm)
    stm = _write(tmp_path / "r2.stm", HEADER + "sw_1 A s1 0.00 x2 <O> a\n")
    with pytest.raises(AsrtrainError, match=r"r2\.stm:2: STM end time"):
        read_stm(stm)
    ctm = _write(tmp_path / "h.ctm", "sw_1 A 0.1 0.2 a\nsw_1 A 0.1 a\n")
    with pytest.raises(AsrtrainError, match=r"h\.ctm:2"):
        read_ctm(ctm)
    ctm = _write(tmp_path / "h2.ctm", "sw_1 A 0.1 zz a\n")
    with pytest.raises(AsrtrainError, match=r"h2\.ctm:1: CTM duration"):
        read_ctm(ctm)


def test_scoring_errors(tmp_path: Path) -> None:
    stm = _write(tmp_path / "r.stm", HEADER + "sw_1 A s1 0.00 2.00 <O,F> a\n")
    ctm = _write(tmp_path / "h.ctm", "sw_1 A 0.1 0.2 a\n")
    with pytest.raises(AsrtrainError, match=r"r\.stm:2: label 'f' is not defined"):
        score_hub5(stm, ctm, tmp_path / "out", glm=GLM)
    stm = _write(tmp_path / "r.stm", HEADER + "sw_1 A s1 0.00 2.00 <O> a\n")
    ctm = _write(tmp_path / "h.ctm", "sw_9 A 0.1 0.2 a\n")
    with pytest.raises(AsrtrainError, match="sw_9"):
        score_hub5(stm, ctm, tmp_path / "out", glm=GLM)
    stm = _write(tmp_path / "r.stm", HEADER + "sw_1 A s1 0.00 2.00 <O> a (b c\n")
    ctm = _write(tmp_path / "h.ctm", "sw_1 A 0.1 0.2 a\n")
    with pytest.raises(AsrtrainError, match=r"r\.stm:2: badly formed"):
        score_hub5(stm, ctm, tmp_path / "out", glm=GLM)
    with pytest.raises(AsrtrainError, match="unknown scoring backend"):
        score_hub5(stm, ctm, tmp_path / "out", glm=GLM, backend="nope")


# ---------------------------------------------------------------- reports and CLI


@pytest.mark.timeout(120)
def test_reports_match_sclite_layout(tmp_path: Path) -> None:
    stm = _write(tmp_path / "r.stm", HEADER +
                 "sw_4390 A sw_4390_A 0.00 2.00 <O> hello there uh how are you\n"
                 "sw_4390 A sw_4390_A 4.00 6.00 <O> i (uh) am fine- thanks he's gonna go\n"
                 "en_6000 A en_6000_A 0.00 3.00 <O> Can't Do That mm-hmm\n")
    ctm = _write(tmp_path / "hyp.ctm",
                 "sw_4390 A 0.1 0.3 hello\nsw_4390 A 0.5 0.3 their\nsw_4390 A 1.0 0.3 how\n"
                 "sw_4390 A 1.5 0.3 are\nsw_4390 A 1.8 0.1 you\nsw_4390 A 4.1 0.3 i\n"
                 "sw_4390 A 4.5 0.3 am\nsw_4390 A 4.9 0.3 finer\nsw_4390 A 5.2 0.3 thanks\n"
                 "sw_4390 A 5.6 0.3 he's\nsw_4390 A 5.9 0.3 going\n"
                 "en_6000 A 0.1 0.5 can't\nen_6000 A 1.1 0.5 do\n")
    py = score_hub5(stm, ctm, tmp_path / "py", glm=GLM, kaldi_filter=False)
    sc = score_hub5(stm, ctm, tmp_path / "sc", glm=GLM, kaldi_filter=False, backend="sclite")
    assert {k: v.as_dict() for k, v in py.items()} == {k: v.as_dict() for k, v in sc.items()}
    assert py["all"].as_dict() == {"corr": 11, "sub": 3, "dels": 5, "ins": 1, "err": 9,
                                   "ref_words": 19, "segments": 3, "sent_err": 3}
    for name in ("hyp.ctm.filt", "hyp.ctm.swbd.filt", "hyp.ctm.callhm.filt"):
        for ext in (".sys", ".raw"):
            assert (tmp_path / "py" / (name + ext)).read_text() == (
                tmp_path / "sc" / (name + ext)).read_text(), name + ext
    for name in ("hyp.ctm.filt.dtl", "hyp.ctm.swbd.filt.dtl"):
        assert (tmp_path / "py" / name).read_text() == (tmp_path / "sc" / name).read_text(), name


def test_score_command(tmp_path: Path) -> None:
    stm = _write(tmp_path / "r.stm", HEADER + "sw_1 A s1 0.00 2.00 <O> a b c\n"
                 "en_2 A s2 0.00 2.00 <O> d e\n")
    ctm = _write(tmp_path / "h.ctm", "sw_1 A 0.1 0.2 a\nsw_1 A 0.5 0.2 x\nsw_1 A 0.9 0.2 c\n"
                 "sw_1 A 1.2 0.2 uh\nen_2 A 0.3 0.2 d\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(score_command, ["--stm", str(stm), "--ctm", str(ctm), "--glm",
                                                str(GLM), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "Sum/Avg" in line]
    assert len(rows) == 3
    assert rows[0].split() == ["all", "|", "Sum/Avg", "|", "2", "5", "|", "60.0", "20.0", "20.0",
                               "0.0", "40.0", "100.0", "|"]
    assert rows[1].split()[0] == "SWB" and rows[2].split()[0] == "CallHome"
    assert (out / "h.ctm.filt.sys").is_file() and (out / "h.ctm.callhm.filt.dtl").is_file()
    # --no-filter keeps the hesitation, which becomes an insertion
    result = CliRunner().invoke(score_command, ["--stm", str(stm), "--ctm", str(ctm), "--glm",
                                                str(GLM), "--out", str(out), "--no-filter"])
    assert result.exit_code == 0, result.output
    assert [x for x in result.output.splitlines() if "Sum/Avg" in x][0].split()[10] == "20.0"
    # Through the asrtrain command, whose one-line error this is.
    bad = CliRunner().invoke(main, ["score", "--stm", str(tmp_path / "missing.stm"), "--ctm",
                                    str(ctm), "--out", str(out)])
    assert bad.exit_code == 1 and bad.output.startswith("asrtrain: error: STM file ")
    assert "missing.stm does not exist" in bad.output and "Traceback" not in bad.output


@pytest.mark.timeout(120)
def test_no_glm_equals_sclite(tmp_path: Path) -> None:
    stm = _write(tmp_path / "r.stm", HEADER + "sw_1 A s1 0.00 2.00 <O> uh-huh he's (uh) x-ray\n"
                 "en_2 A s2 0.00 2.00 <O> mm gonna go\n")
    ctm = _write(tmp_path / "h.ctm", "sw_1 A 0.1 0.2 mhm\nsw_1 A 0.5 0.2 he's\n"
                 "sw_1 A 0.9 0.2 x\nsw_1 A 1.2 0.2 ray\nen_2 A 0.3 0.2 um\nen_2 A 0.8 0.2 gonna\n")
    py = score_hub5(stm, ctm, tmp_path / "py", glm=None, kaldi_filter=False)
    sc = score_hub5(stm, ctm, tmp_path / "sc", glm=None, kaldi_filter=False, backend="sclite")
    assert {k: v.as_dict() for k, v in py.items()} == {k: v.as_dict() for k, v in sc.items()}
    assert py["all"].sub == 2  # without a GLM neither uh-huh/mhm nor mm/um are mapped


# ---------------------------------------------------------------- score_decode and report_wer


def _data_dir(path: Path, stm: str | None, text: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    if stm is not None:
        _write(path / "stm", stm)
        _write(path / "glm", GLM.read_text(encoding="latin-1"))
    _write(path / "text", "".join(f"{u} {t}\n" for u, t in sorted(text.items())))
    _write(path / "utt2spk", "".join(f"{u} {u.split('-')[0]}\n" for u in sorted(text)))
    return path


@pytest.mark.timeout(120)
def test_score_decode_with_stm_is_hub5_scoring(tmp_path: Path) -> None:
    """An stm in the data dir: the decode dir's ctm scored with its glm for all/swbd/callhm,
    the same counts as score_hub5 (and SCTK's hubscr.pl), sclite's reports under score/."""
    stm = (HEADER + "sw_1 A s1 0.00 2.00 <O> uh-huh he is going\n"
           "en_2 A s2 0.00 2.00 <O> mm gonna go there\n")
    data = _data_dir(tmp_path / "data", stm, {"s1-1": "ignored", "s2-1": "ignored"})
    dec = tmp_path / "decode" / "tri2" / "eval2000"
    dec.mkdir(parents=True)
    _write(dec / "ctm", "sw_1 A 0.1 0.2 uh-huh\nsw_1 A 0.5 0.2 he's\nsw_1 A 0.9 0.2 going\n"
           "sw_1 A 1.2 0.2 [noise]\nen_2 A 0.3 0.2 um\nen_2 A 0.8 0.2 gonna\n")
    counts = score_decode(data, dec)
    want = score_hub5(data / "stm", dec / "ctm", tmp_path / "direct", glm=data / "glm")
    assert set(counts) == {"all", "swbd", "callhm"}
    assert {k: c.as_dict() for k, c in counts.items()} == {k: c.as_dict() for k, c in want.items()}
    assert (counts["swbd"].err, counts["callhm"].ref_words) == (0, 5)
    for name in ("ctm.filt", "ctm.swbd.filt", "ctm.callhm.filt"):
        assert (dec / "score" / f"{name}.sys").read_text() == (
            tmp_path / "direct" / f"{name}.sys").read_text().replace("hyp.ctm", "ctm")
    sc = score_decode(data, dec, backend="sclite")
    assert {k: c.as_dict() for k, c in sc.items()} == {k: c.as_dict() for k, c in counts.items()}
    # without Kaldi's filter the [noise] token is an insertion
    assert score_decode(data, dec, kaldi_filter=False)["swbd"].ins == 1
    with pytest.raises(AsrtrainError, match="unknown scoring backend 'perl'"):
        score_decode(data, dec, backend="perl")
    (dec / "ctm").unlink()
    with pytest.raises(AsrtrainError, match=f"{dec / 'ctm'}: missing"):
        score_decode(data, dec)


def test_score_decode_without_stm_is_plain_wer(tmp_path: Path) -> None:
    """No stm: the decode dir's text against the data dir's text, subset all only, sclite's
    alignment (case-insensitive, optional words), per-speaker reports and per-utterance
    alignments under score/."""
    data = _data_dir(tmp_path / "data", None, {"a-1": "the cat (uh) sat", "a-2": "on the mat",
                                               "b-1": "Hello World"})
    dec = tmp_path / "dec"
    dec.mkdir()
    _write(dec / "text", "a-1 the cat sat down\na-2\nb-1 hello word\n")
    counts = score_decode(data, dec)
    assert list(counts) == ["all"]
    c = counts["all"]
    assert (c.corr, c.sub, c.dels, c.ins, c.segments, c.sent_err) == (5, 1, 3, 1, 3, 3)
    sys_report = (dec / "score" / "text.sys").read_text()
    assert "Sum/Avg" in sys_report and "| a " in sys_report and "| b " in sys_report
    pra = (dec / "score" / "text.pra").read_text()
    assert "File: b-1" in pra and "Scores: (#C #S #D #I) 1 1 0 0" in pra
    assert (dec / "score" / "text.dtl").is_file()
    _write(dec / "text", "a-1 the cat sat\nzz-9 extra\n")
    with pytest.raises(AsrtrainError, match=r"dec/text: 1 utterance\(s\) have no reference"):
        score_decode(data, dec)
    (dec / "text").unlink()
    with pytest.raises(AsrtrainError, match=f"{dec / 'text'}: missing"):
        score_decode(data, dec)
    (data / "text").unlink()
    with pytest.raises(AsrtrainError, match=f"{data / 'text'}: missing .no stm"):
        score_decode(data, dec)
    with pytest.raises(AsrtrainError, match="not a data directory"):
        score_decode(tmp_path / "nothing", dec)


def test_report_wer_prints_logs_and_writes(tmp_path: Path, capsys, caplog) -> None:
    c = Counts(corr=529, sub=27, dels=14, ins=0, segments=40, sent_err=12)
    empty = Counts(ins=2)
    with caplog.at_level("INFO", logger="asrtrain.score"):
        report_wer("eval2000", "hybrid_tiny", {"all": c, "callhm": empty}, tmp_path / "score")
    lines = ["eval2000 all: WER 7.19% [ 41 / 570, 0 ins, 14 del, 27 sub ] hybrid_tiny",
             "eval2000 callhm: WER 200.00% [ 2 / 0, 2 ins, 0 del, 0 sub ] hybrid_tiny"]
    assert capsys.readouterr().out.splitlines() == lines
    assert [r.getMessage() for r in caplog.records] == lines
    assert (tmp_path / "score" / "wer").read_text().splitlines() == [
        "eval2000_all WER 7.19% [ 41 / 570, 0 ins, 14 del, 27 sub ] hybrid_tiny",
        "eval2000_callhm WER 200.00% [ 2 / 0, 2 ins, 0 del, 0 sub ] hybrid_tiny"]
    assert counts_json({"all": c})["all"] == {"wer": 7.19, **c.as_dict()}
