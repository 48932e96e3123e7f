"""The results table's columns and its one wording of where a decoding setting was chosen
(issue 27.6): SWB and CallHome columns only for a test set that has those subsets, and the same
words in the decode logs, ``decode.json`` and RESULTS.md. In-process, on Result records as the
scoring stages write them."""

from __future__ import annotations

from pathlib import Path

from asrtrain.report import (
    Result,
    chosen_on,
    chosen_words,
    results_markdown,
    results_text,
    selection,
)


def _counts(wer: float, ref: int, sub: int, dels: int, ins: int) -> dict:
    return {"wer": wer, "err": sub + dels + ins, "ref_words": ref, "sub": sub, "dels": dels,
            "ins": ins}


def _result(system: str, kind: str, set_name: str, subsets: tuple[str, ...],
            chosen: str | None) -> Result:
    wer = {s: _counts(10.0, 100, 5, 3, 2) for s in subsets}
    return Result(system, kind, set_name, "hub5" if "swbd" in subsets else "plain", wer,
                  {"acoustic_scale": 0.0833} if kind == "GMM" else {}, chosen, "decode_gmm",
                  "0123456789abcdef", "2026-11-26 12:00", 0.0)


def test_a_plain_corpus_shows_no_swb_or_callhome_columns(tmp_path: Path) -> None:
    results = [_result("blstm", "CTC", "test", ("all",), None),
               _result("tri1", "GMM", "test", ("all",), "dev")]
    short = results_text(results)
    header = short.splitlines()[0].split()
    assert header == ["system", "kind", "set", "WER", "sub/del/ins", "chosen", "on"], short
    assert "–" not in short.splitlines()[2].split()[:4], short   # no empty subset cells
    table = results_markdown(tmp_path, results)
    header_row = next(ln for ln in table.splitlines() if ln.startswith("| system"))
    assert "SWB" not in header_row and "CallHome" not in header_row, header_row


def test_a_hub5_set_keeps_its_subset_columns(tmp_path: Path) -> None:
    results = [_result("blstm", "CTC", "eval2000", ("all", "swbd", "callhm"), None),
               _result("tri1", "GMM", "dev", ("all",), "dev")]
    header = results_text(results).splitlines()[0].split()
    assert header[3:6] == ["WER", "SWB", "CallHome"]
    row = results_text(results).splitlines()[2].split()
    assert row[3:6] == ["10.00", "–", "–"]   # the plain dev set: no subsets of its own
    assert "| WER | SWB | CallHome |" in results_markdown(tmp_path, results)


def test_one_wording_of_where_a_setting_was_chosen() -> None:
    # the test set itself (Kaldi's habit), the dev set (held out), the config
    assert selection("eval2000", 2) == "chosen on eval2000 itself (optimistic), the best of 2"
    assert selection("eval2000", 1, "train_dev") == "chosen on train_dev (held out)"
    assert selection("eval2000", 1) == "fixed by the config"
    # the dev set's own decode, when the choice is held out there: the best on itself
    assert selection("train_dev", 3) == "chosen on train_dev itself (optimistic), the best of 3"
    # RESULTS.md's column says the same words as the decode logs
    for set_name, n, tuned in [("eval2000", 2, None), ("eval2000", 1, "train_dev"),
                               ("eval2000", 1, None)]:
        where = chosen_on(n, set_name, tuned)
        assert chosen_words(set_name, where) in selection(set_name, n, tuned)
        row = results_text([_result("tri1", "GMM", set_name, ("all",), where)]).splitlines()[1]
        assert row.endswith(chosen_words(set_name, where)), row
