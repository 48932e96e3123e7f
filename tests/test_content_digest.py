"""Inputs known by content, and a lexicon that never retrains the CTC model (issues 26.1, 27.1),
through the real CLI on recipes/datadir: the user's data dir tables and lexicon enter the
digests of the stages that read them by content (a touch reruns nothing, an edit reruns exactly
what depends on it and --dry-run names the file); adding or editing a lexicon reruns only the
stages that read it, and prepare's data dirs and the CTC units stay byte-identical."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from test_datadir_recipe import RECIPE, REPO, ok, run_cli, sets
from test_e2e import SMALL

SMALL_AUTO_NJ = [o for o in SMALL if not o.startswith("nj=")]
CTC = ["prepare", "lang", "features", "train", "decode", "score"]


@pytest.fixture(scope="module")
def corpus(user_corpus: Path) -> Path:
    """conftest's user_corpus (read-only), under this module's name for it."""
    return user_corpus


def plan(*args: str) -> tuple[list[str], str]:
    """The stages ``--dry-run`` says would run, and its listing: the run command in this
    process (click's runner, in the repository as run_cli), a process's start-up saved."""
    from click.testing import CliRunner

    from asrtrain.cli import run as run_command

    with contextlib.chdir(REPO):
        result = CliRunner().invoke(run_command, [str(RECIPE), *args, "--dry-run"])
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    out = result.stdout
    lines = [ln.split(None, 2) for ln in out.splitlines() if ln.strip()]
    return [name for name, what, *_ in lines if what == "runs:"], out


def _sums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def ctc_only(corpus: Path, tmp_path_factory) -> tuple[list[str], Path, Path]:
    """A finished CTC-only run (no lexicon) on a copy of the user's data dirs; returns its
    command-line settings, the exp dir and the copy."""
    root = tmp_path_factory.mktemp("content")
    mine = root / "mine"
    for name in ("train", "dev", "test"):
        shutil.copytree(corpus / name, mine / name)
    shutil.copy(corpus / "lex.txt", mine / "lex.txt")
    exp = root / "exp"
    args = [f"exp_dir={exp}", sets(mine, "train", "dev", "test"), *SMALL_AUTO_NJ]
    proc = ok(run_cli(*args, timeout=1800))
    assert all(f"stage {s:<13} done" in proc.stderr for s in CTC)
    return args, exp, mine


def test_a_touched_table_reruns_nothing(ctc_only) -> None:
    args, exp, mine = ctc_only
    text = mine / "train" / "text"
    st = text.stat()
    os.utime(text, ns=(st.st_atime_ns, st.st_mtime_ns + 10**10))
    (mine / "test" / "utt2spk").write_bytes((mine / "test" / "utt2spk").read_bytes())
    assert plan(*args)[0] == []
    # the files' hashes are cached with their size and time: the touched ones are hashed again
    cache = (exp / ".done" / ".files").read_text()
    assert str(text) in cache


def test_a_lexicon_added_reruns_no_ctc_stage(ctc_only) -> None:
    args, exp, mine = ctc_only
    lexicon = f"corpus.lexicon={mine / 'lex.txt'}"
    would, listing = plan(*args, lexicon)
    assert would == ["lang", "lm", "mfcc", "align", "fmllr", "decode_gmm", "train_hybrid",
                     "decode_hybrid"], listing
    assert "lang           runs: config changed: corpus.lexicon: None -> " in listing
    data, units = _sums(exp / "data"), (exp / "lang" / "units.model").read_bytes()
    results = (exp / "RESULTS.md").read_text()
    proc = ok(run_cli(*args, lexicon, "--to", "lang"))
    assert "stage lang          starts" in proc.stderr and "units.model kept" in proc.stderr
    assert (exp / "lang" / "L.fst").is_file()
    # the CTC chain keeps its digests: its stages are done, with the lexicon as without
    assert plan(*args, lexicon, "systems=[ctc]")[0] == []
    assert (exp / "lang" / "units.model").read_bytes() == units
    assert {k: v for k, v in _sums(exp / "data").items() if not k.startswith("local/")} == data
    assert "local/dict/lexicon.txt" in _sums(exp / "data")
    assert (exp / "RESULTS.md").read_text() == results
    # an edited lexicon reruns lang (named), and still no CTC stage
    with open(mine / "lex.txt", "a") as f:
        f.write("zzyzx z ih z ih k s\n")
    would, listing = plan(*args, lexicon, "systems=[ctc]")
    assert would == ["lang"], listing
    assert f"lang           runs: changed: {mine / 'lex.txt'}" in listing
    ok(run_cli(*args, lexicon, "systems=[ctc]"))
    assert (exp / "lang" / "units.model").read_bytes() == units
    assert "zzyzx z ih z ih k s" in (exp / "data" / "local" / "dict" / "lexicon.txt").read_text()
    # and taken away again: lang reruns, its dict dir goes, the CTC chain stays
    assert plan(*args)[0] == ["lang"]
    ok(run_cli(*args, "--to", "lang"))
    assert not (exp / "data" / "local" / "dict").exists()
    assert plan(*args)[0] == []


def test_an_edited_transcript_reruns_prepare_and_what_follows(ctc_only) -> None:
    args, exp, mine = ctc_only
    text = mine / "train" / "text"
    lines = text.read_text().splitlines()
    utt, *words = lines[1].split()
    lines[1] = " ".join([utt, *reversed(words)])
    text.write_text("\n".join(lines) + "\n")
    would, listing = plan(*args)
    assert would == CTC, listing
    assert f"prepare        runs: changed: {text}" in listing
    ok(run_cli(*args, "--to", "prepare"))
    assert f"{utt} {' '.join(reversed(words))}\n" in (exp / "data" / "train" / "text").read_text()
    assert plan(*args)[0] == CTC[1:]


def test_a_kaldi_import_is_known_by_content(tmp_path: Path) -> None:
    """align.source=kaldi's alignments enter align's digest by content, align.kaldi_fmllr's
    matrices those of the stages that write fMLLR feature dirs (fmllr, decode_gmm): an edit
    reruns the stage that reads the file and names it, a touch reruns nothing; an edited fMLLR
    import leaves the alignments (and the GMM passes) as they were."""
    from test_e2e import REPO

    from asrtrain.pipeline import Pipeline
    from asrtrain.recipe import compose_recipe
    from asrtrain.stages import STAGES

    kaldi = tmp_path / "ali"
    kaldi.mkdir()
    (kaldi / "num_pdfs").write_text("10\n")
    (kaldi / "pdf.1.ark").write_bytes(b"utt1 \0B\4\1\0\0\0\4\3\0\0\0")
    trans = tmp_path / "trans"
    trans.mkdir()
    (trans / "trans.1").write_bytes(b"spk1 matrix")
    (tmp_path / "final.mat").write_bytes(b"a matrix")
    args = [f"exp_dir={tmp_path / 'exp'}", "align.source=kaldi", f"align.kaldi_dir={kaldi}",
            f"+align.kaldi_fmllr={{final_mat: {tmp_path / 'final.mat'}, splice_opts: null, "
            f"trans: {{train_nodup: {trans}}}}}"]

    def pipeline() -> Pipeline:
        return Pipeline(compose_recipe(REPO / "recipes" / "tiny", args), STAGES)

    before = pipeline()
    assert set(before.files["align"]) == {str(kaldi / "num_pdfs"), str(kaldi / "pdf.1.ark")}
    imported = {str(trans / "trans.1"), str(tmp_path / "final.mat")}
    assert set(before.files["fmllr"]) == set(before.files["decode_gmm"]) == imported
    os.utime(tmp_path / "final.mat", ns=(1, 10**18))
    assert pipeline().digests == before.digests
    for edited in (kaldi / "pdf.1.ark", trans / "trans.1", tmp_path / "final.mat"):
        edited.write_bytes(edited.read_bytes() + b"!")
        after = pipeline()
        reader = "align" if edited == kaldi / "pdf.1.ark" else "fmllr"
        assert after.digests[reader] != before.digests[reader], edited
        assert (after.digests["align"] == before.digests["align"]) == (reader == "fmllr")
        assert after.files[reader][str(edited)] != before.files[reader][str(edited)]
        assert after.digests["mfcc"] == before.digests["mfcc"]
        assert f"changed: {edited}" in "; ".join(after._why_changed(
            reader, {"digest": "", "config": before.values[reader],
                     "inputs": before.inputs[reader], "files": before.files[reader]}))
        before = after


# ---------------------------------------------------------------- one scoring for every row
def test_rows_scored_with_other_options_are_rescored(tmp_path: Path) -> None:
    """A decode dir scored with score.kaldi_filter=true is stale once the recipe says false:
    rescore_stale scores it again (counts, result.json, wer, RESULTS.md); a plain-WER row has no
    options and is never stale."""
    import json
    from dataclasses import asdict

    from asrtrain.report import Result
    from asrtrain.score import counts_json, score_decode
    from asrtrain.score.rescore import rescore_stale, stale

    exp = tmp_path / "exp"
    hub5, plain = exp / "data" / "eval", exp / "data" / "dev"
    hub5.mkdir(parents=True)
    plain.mkdir(parents=True)
    (hub5 / "stm").write_text(';; LABEL "O" "Overall" "Overall"\n'
                              "sw_1 A s1 0.00 2.00 <O> a b\n")
    (plain / "text").write_text("u1 a b\n")
    rows = {}
    for system, data in (("hyb", hub5), ("ctc", plain)):
        dec = exp / "decode" / system / data.name
        dec.mkdir(parents=True)
        (dec / "ctm").write_text("sw_1 A 0.10 0.20 a\nsw_1 A 0.50 0.20 [noise]\n"
                                 "sw_1 A 1.00 0.20 b\n")
        (dec / "text").write_text("u1 a b b\n")
        counts = score_decode(data, dec, kaldi_filter=True)
        result = Result(system, "hybrid", data.name, "hub5", counts_json(counts), {}, None,
                        "decode_hybrid", None, None)
        (dec / "score" / "result.json").write_text(json.dumps(asdict(result)))
        rows[system] = dec
    assert json.loads((rows["hyb"] / "score" / "result.json").read_text())["wer"]["all"][
        "ins"] == 0   # the filter drops [noise]
    unfiltered = {"kaldi_filter": False, "backend": "python"}
    assert [d for d, _ in stale(exp, unfiltered)] == [rows["hyb"]]
    assert rescore_stale(exp, unfiltered) == [rows["hyb"]]
    result = json.loads((rows["hyb"] / "score" / "result.json").read_text())
    assert result["wer"]["all"]["ins"] == 1 and result["system"] == "hyb"
    assert "[ 1 / 2, 1 ins, 0 del, 0 sub ] hyb" in (rows["hyb"] / "score" / "wer").read_text()
    assert "| hyb |" in (exp / "RESULTS.md").read_text()
    assert json.loads((rows["hyb"] / "score" / "scoring.json").read_text()) == {
        "rules": "hub5", **unfiltered}
    assert rescore_stale(exp, unfiltered) == [] and stale(exp, unfiltered) == []
