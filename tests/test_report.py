"""Results at a glance, on a real tiny run through the CLI: ``exp/RESULTS.md`` after every scoring
step, the summary ``asrtrain run`` ends with (skipped stages included), ``asrtrain report`` on a
recipe or an exp dir, and the decoding settings chosen on the dev set (``score.tune_on``)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import forked_cli
import pytest
from conftest import copy_exp
from test_e2e import ALIGN_SMALL, HYBRID_SMALL, REPO, SMALL, asrtrain

from asrtrain import AsrtrainError
from asrtrain.decode import tuning_set
from asrtrain.recipe import compose_recipe
from asrtrain.report import collect

# The GMM passes are decoded here (ALIGN_SMALL leaves them out for speed elsewhere).
ALIGN = [o for o in ALIGN_SMALL if not o.startswith("align.decode=")] + ["align.decode=true"]
# The hybrid sweep over three LM weights instead of HYBRID_SMALL's fixed one.
SWEEP = [o for o in HYBRID_SMALL if "lmwt" not in o] + ["+hybrid.decode.min_lmwt=9",
                                                        "+hybrid.decode.max_lmwt=11"]
SYSTEMS = [("blstm_tiny", "CTC", "score"), ("mono", "GMM", "decode_gmm"),
           ("tri1", "GMM", "decode_gmm"),
           ("hybrid_tiny", "hybrid", "decode_hybrid")]
WER_FILE = re.compile(r"^eval2000_(all|swbd|callhm) WER (\d+\.\d+)% \[ (\d+) / (\d+), (\d+) ins, "
                      r"(\d+) del, (\d+) sub \] (\S+)$", re.M)


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the one table in RESULTS.md, keyed by its header."""
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")), strict=True))
            for ln in lines[1:]]


def summary_rows(stdout: str) -> list[list[str]]:
    """The rows of the table `asrtrain run` ends with (after its 'Results (...)' line)."""
    tail = stdout[stdout.rindex("Results ("):].splitlines()[2:]
    return [re.split(r"\s{2,}", ln.strip()) for ln in tail if ln.strip()]


def stored_wer(decode_dir: Path) -> dict[str, tuple[str, int, int, int, int]]:
    """score/wer of a decode dir: subset -> (WER, ref words, sub, del, ins)."""
    return {m.group(1): (m.group(2), int(m.group(4)), int(m.group(7)), int(m.group(6)),
                         int(m.group(5)))
            for m in WER_FILE.finditer((decode_dir / "score" / "wer").read_text())}


@pytest.fixture(scope="module")
def tiny(tiny_trained: dict, tmp_path_factory) -> dict:
    """conftest's trained tiny experiment (a copy) with the GMM passes decoded (ALIGN): the
    first run here decodes them (and decode_hybrid, which reads decode_gmm, again) and prints
    every system's figures; ``gmm`` is what the session's
    run of the passes printed (conftest's tiny_tri1)."""
    exp = copy_exp(tiny_trained["exp"], tmp_path_factory.mktemp("report") / "exp")
    args = ["recipes/tiny", f"exp_dir={exp}", *SMALL, *ALIGN, *HYBRID_SMALL]
    first = asrtrain("run", *args)
    assert re.findall(r"stage (\w+) +starts", first.stderr) == ["decode_gmm", "decode_hybrid"], \
        first.stderr[-3000:]
    return {"exp": exp, "args": args, "first": first, "gmm": tiny_trained["gmm_stderr"]}


def test_results_table_rows_for_a_real_tiny_run(tiny: dict) -> None:
    """One row per system and pass (CTC, mono, tri1, hybrid) in pipeline order, each with the
    Hub5 WERs its score/wer holds, the setting and where it was chosen, the digest of the stage
    that scored it (its .done record) and the date."""
    exp = tiny["exp"]
    rows = markdown_rows((exp / "RESULTS.md").read_text())
    assert [(r["system"], r["kind"], r["set"]) for r in rows] == [
        (s, k, "eval2000") for s, k, _ in SYSTEMS]
    for row, (system, _kind, stage) in zip(rows, SYSTEMS, strict=True):
        dec = exp / "decode" / system / "eval2000"
        wer = stored_wer(dec)
        assert (row["WER"], row["SWB"], row["CallHome"]) == (
            wer["all"][0], wer["swbd"][0], wer["callhm"][0])
        assert row["sub / del / ins"] == "{} / {} / {}".format(*wer["all"][2:])
        assert row["words"] == str(wer["all"][1]) == "593"
        record = json.loads((exp / ".done" / stage).read_text())
        assert row["stage digest"] == f"{stage} {record['digest'][:8]}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", row["date"])
    ctc, mono, tri1, hybrid = rows
    assert (ctc["setting"], ctc["chosen on"]) == ("ctc_greedy", "–")
    for row in (mono, tri1):
        scale = json.loads((exp / "decode" / row["system"] / "eval2000" / "decode.json")
                           .read_text())["acoustic_scale"]
        assert row["setting"].startswith(f"acoustic scale {scale:.4g} ")
        assert row["chosen on"] == "eval2000 itself (optimistic)"
    assert hybrid["setting"] == "LM weight 10, insertion penalty 0.0"
    assert hybrid["chosen on"] == "fixed by the config"
    # which epochs' model was decoded (decode.checkpoint): one epoch trained, so that one
    for row in (ctc, hybrid):
        chosen = json.loads((exp / "decode" / row["system"] / "eval2000" / "decode.json")
                            .read_text())["checkpoint"]
        assert row["model decoded"] == chosen["description"]
        assert chosen["epochs"] == [1] and row["model decoded"].startswith(
            "average of the 5 best epochs: only epoch 1 (dev loss ")
    assert mono["model decoded"] == tri1["model decoded"] == "–"


def test_run_ends_with_the_summary_and_gmm_details_stay_in_the_stage_log(tiny: dict) -> None:
    """The summary lists every system; the GMM passes print only the Hub5 WER lines (the same
    as score/wer) and one line per pass, their per-iteration JSON goes to log/align.log."""
    exp, out = tiny["exp"], tiny["first"]
    rows = markdown_rows((exp / "RESULTS.md").read_text())
    assert summary_rows(out.stdout) == [
        [r["system"], r["kind"], r["set"], r["WER"], r["SWB"], r["CallHome"],
         r["sub / del / ins"].replace(" ", ""), r["chosen on"]] for r in rows]
    for system in ("mono", "tri1"):
        wer = stored_wer(exp / "decode" / system / "eval2000")
        printed = re.findall(rf"^eval2000 (\w+): WER (\d+\.\d+)% .* {system}$", out.stdout, re.M)
        assert sorted(printed) == sorted((k, v[0]) for k, v in wer.items())
        assert re.search(rf"align {system}: \d+ pdfs, \d+ Gaussians", tiny["gmm"])
    assert '{"iter"' not in out.stderr + out.stdout + tiny["gmm"]
    assert '{"iter"' in (exp / "log" / "align.log").read_text()
    assert "Hub5 rules: ctm against" in out.stderr


def test_skipped_stages_still_show_their_figures(tiny: dict) -> None:
    """A second run does nothing and prints the same summary; so does the score stage alone
    (`make score`), with every system's stored WER, not only the CTC model's."""
    first = summary_rows(tiny["first"].stdout)
    again = asrtrain("run", *tiny["args"])
    assert "nothing to do" in again.stderr
    assert summary_rows(again.stdout) == first
    score = asrtrain("run", *tiny["args"], "--stage", "score", "--to", "score")
    assert summary_rows(score.stdout) == first
    dry = asrtrain("run", *tiny["args"], "--dry-run")
    assert "Results (" not in dry.stdout


def test_report_command_on_a_recipe_or_an_exp_dir(tiny: dict, tmp_path: Path) -> None:
    exp = tiny["exp"]
    by_recipe = asrtrain("report", "recipes/tiny", f"exp_dir={exp}").stdout
    assert by_recipe == asrtrain("report", str(exp)).stdout == (exp / "RESULTS.md").read_text()
    short = asrtrain("report", str(exp), "--short").stdout
    assert summary_rows("Results (x):\n" + short) == summary_rows(tiny["first"].stdout)
    # An experiment of an older version, scored before result.json existed, is not read from
    # its score/wer (its stages rerun, README): it lists no system.
    old = tmp_path / "old"
    shutil.copytree(exp / "decode", old / "decode")
    shutil.copytree(exp / ".done", old / ".done")
    for path in old.glob("decode/*/*/score/result.json"):
        path.unlink()
    assert list(old.glob("decode/*/*/score/wer")) and collect(old) == []


@pytest.mark.parametrize("args, message", [
    (["report", "{empty}"], "{empty}: no scored system"),
    (["report", "{empty}", "exp_dir=x"], "need a recipe dir"),
    (["run", "recipes/tiny", "exp_dir={empty}/exp", "score.tune_on=sometimes", "--dry-run"],
     "score.tune_on='sometimes': expected one of auto, test, dev"),
])
def test_errors_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = forked_cli.run(*(a.format(empty=empty) for a in args), timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith("asrtrain: error: ") and "Traceback" not in proc.stderr
    assert message.format(empty=empty) in proc.stderr


def test_tune_on_defaults_to_dev_for_your_own_corpus() -> None:
    """auto: the dev set for recipes/datadir, the test set itself for the LDC/tiny recipes."""
    mine = compose_recipe(REPO / "recipes" / "datadir",
                          ["corpus.sets={train: /d/train, dev: /d/dev, test: /d/test}"])
    assert tuning_set(mine) == "dev"
    assert tuning_set(compose_recipe(REPO / "recipes" / "datadir",
                                     ["corpus.sets={train: /a, dev: /b, test: /c}",
                                      "score.tune_on=test"])) is None
    assert tuning_set(compose_recipe(REPO / "recipes" / "tiny")) is None
    assert tuning_set(compose_recipe(REPO / "recipes" / "swb300")) is None
    assert tuning_set(compose_recipe(REPO / "recipes" / "tiny", ["score.tune_on=dev"])) == (
        "train_dev")
    with pytest.raises(AsrtrainError, match="score.tune_on='never'"):
        tuning_set(compose_recipe(REPO / "recipes" / "tiny", ["score.tune_on=never"]))


def test_settings_chosen_on_the_dev_set(tiny: dict) -> None:
    """score.tune_on=dev: the GMM passes and the hybrid model decode train_dev first (plain WER:
    no stm), and eval2000 with its best setting; RESULTS.md says so. The passes are decoded
    again, not retrained; the CTC model's score stage does not rerun."""
    exp = tiny["exp"]
    args = ["recipes/tiny", f"exp_dir={exp}", *SMALL, *ALIGN, *SWEEP, "score.tune_on=dev"]
    plan = asrtrain("run", *args, "--dry-run").stdout
    assert re.search(r"^decode_gmm +runs: config changed: align.tune_on: '<absent>' -> "
                     r"'train_dev'", plan, re.M)
    assert re.search(r"^align +done", plan, re.M)
    assert re.search(r"^score +done", plan, re.M)
    mono = exp / "align" / "mono" / "final.mdl"
    trained = mono.stat().st_mtime_ns
    out = asrtrain("run", *args)
    assert mono.stat().st_mtime_ns == trained
    assert re.search(r"stage align +already done", out.stderr)
    rows = {(r["system"], r["set"]): r for r in markdown_rows((exp / "RESULTS.md").read_text())}
    assert rows["blstm_tiny", "eval2000"]["chosen on"] == "–"
    for system, kind, _ in SYSTEMS[1:]:
        dev, test = rows[system, "train_dev"], rows[system, "eval2000"]
        assert (dev["kind"], dev["SWB"], dev["chosen on"]) == (kind, "–",
                                                              "train_dev itself (optimistic)")
        assert test["chosen on"] == "train_dev (held out)"
        assert dev["setting"] == test["setting"]
        dec = exp / "decode" / system
        chosen = json.loads((dec / "eval2000" / "decode.json").read_text())
        assert chosen["tuned_on"] == "train_dev"
        assert "plain per-utterance WER" in out.stderr
        utts = len((exp / "data" / "train_dev" / "text").read_text().splitlines())
        assert (dec / "train_dev" / "score" / "text.pra").read_text().count("Scores: ") == utts
    hybrid = json.loads((exp / "decode" / "hybrid_tiny" / "train_dev" / "decode.json").read_text())
    assert [r["lmwt"] for r in hybrid["sweep"]] == [9, 10, 11]
    assert json.loads((exp / "decode" / "hybrid_tiny" / "eval2000" / "decode.json").read_text())[
        "settings"]["lmwt"] == hybrid["lmwt"]
