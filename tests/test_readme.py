"""The README's quick-start table is what `make smoke` (`asrtrain run recipes/tiny`) prints
(issue 27.5): the summary printer gives the same text from the README's rows (columns, widths,
the "chosen on" words), its systems are the tiny recipe's, in the order the report lists them,
and every row's WER is its errors over one reference word count. The figures themselves come
from the fresh run the README names; the suite's tiny experiments are smaller, so they are not
compared here. In-process, about a second."""

from __future__ import annotations

import re

from test_e2e import REPO

from asrtrain.recipe import compose_recipe
from asrtrain.report import Result, results_text

HEADER = "Results (exp/tiny/RESULTS.md):"
SUBSETS = {"WER": "all", "SWB": "swbd", "CallHome": "callhm"}


def readme_table() -> list[str]:
    """The lines of the README's quick-start summary, its header line first."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(HEADER)
    end = lines.index("```", start)
    return lines[start:end]


def _results(table: list[str]) -> list[Result]:
    header = re.split(r"\s{2,}", table[1].strip())
    out = []
    for line in table[2:]:
        row = dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True))
        sub, dels, ins = (int(x) for x in row["sub/del/ins"].split("/"))
        wer = {SUBSETS[c]: {"wer": float(row[c]), "sub": sub, "dels": dels, "ins": ins}
               for c in SUBSETS if c in row and row[c] != "–"}
        chosen = row["chosen on"]
        chosen_on = (None if chosen == "–" else "config" if chosen == "fixed by the config"
                     else chosen.split()[0])
        out.append(Result(row["system"], row["kind"], row["set"], "hub5", wer, {}, chosen_on,
                          "", None, None))
    return out


def test_the_readme_table_is_what_the_summary_printer_prints() -> None:
    table = readme_table()
    results = _results(table)
    assert f"{HEADER}\n" + results_text(results) == "\n".join(table) + "\n"


def test_the_readme_table_has_the_tiny_recipe_s_systems() -> None:
    cfg = compose_recipe(REPO / "recipes" / "tiny", [])
    expected = ([(str(cfg.model.name), "CTC")]
                + [(str(p), "GMM") for p in cfg.align.passes]
                + [(str(cfg.hybrid.model.name), "hybrid")])
    results = _results(readme_table())
    assert [(r.system, r.kind) for r in results] == expected
    assert {r.set for r in results} == {str(s) for s in cfg.sets.test}


def test_every_readme_wer_is_its_errors_over_one_word_count() -> None:
    results = _results(readme_table())
    counts = None
    for r in results:
        c = r.wer["all"]
        err = c["sub"] + c["dels"] + c["ins"]
        fits = {n for n in range(100, 5000) if round(100 * err / n, 2) == c["wer"]}
        counts = fits if counts is None else counts & fits
    assert counts, "the rows' WERs fit no one reference word count"
