"""sclite-style reports: ``.sys`` (percent by speaker), ``.raw`` (counts), ``.dtl`` (details).

The layout follows sclite's (``-o sum rsum dtl``) closely enough to be read by the same eyes and
the same scripts (Kaldi's ``grep Sum/Avg``); the ``Sum/Avg`` and ``Sum`` rows carry the same
numbers sclite prints.  sclite's NCE column (confidence entropy) is not produced.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from asrtrain.fileio import write_text
from asrtrain.score.align import CORR, DEL, INS, SUB, Counts
from asrtrain.score.hub5 import SystemResult


def _pct(n: int, d: int) -> float:
    return 100.0 * n / d if d else 0.0


def _row_values(c: Counts, percent: bool) -> list[float]:
    if percent:
        return [_pct(c.corr, c.ref_words), _pct(c.sub, c.ref_words), _pct(c.dels, c.ref_words),
                _pct(c.ins, c.ref_words), _pct(c.err, c.ref_words), _pct(c.sent_err, c.segments)]
    return [c.corr, c.sub, c.dels, c.ins, c.err, c.sent_err]


def _fmt_values(values: list[float], as_int: bool) -> str:
    if as_int:
        first, rest = f"{int(values[0]):4d}", [f"{int(v):6d}" for v in values[1:]]
    else:
        first, rest = f"{values[0]:4.1f}", [f"{v:6.1f}" for v in values[1:]]
    return first + " " + " ".join(rest)


def _centre(text: str, width: int) -> str:
    # sclite puts the odd padding space on the right
    left = max(0, (width - len(text)) // 2)
    return " " * left + text + " " * max(0, width - len(text) - left)


def summary_table(result: SystemResult, percent: bool) -> str:
    """The ``.sys`` (percent=True) or ``.raw`` (percent=False) table."""
    names = sorted(result.speakers)
    total = result.total
    width = max([len(n) for n in names] + [len("Sum/Avg"), len("SPKR")])
    header = f"| {'SPKR':<{width}} | # Snt # Wrd | Corr    Sub    Del    Ins    Err  S.Err |"
    inner = len(header) - 2
    title = result.title
    rule_top = f"|-{'-' * width}-+-------------+-----------------------------------------|"
    lines = ["", "", "",
             "SYSTEM SUMMARY PERCENTAGES by SPEAKER".center(80), "",
             "," + "-" * inner + ".",
             "|" + _centre(title, inner) + "|",
             "|" + "-" * inner + "|",
             header,
             rule_top]
    rule = f"|-{'-' * width}-+-------------+-----------------------------------------|"
    for i, name in enumerate(names):
        c = result.speakers[name]
        lines.append(f"| {name:<{width}} | {c.segments:4d} {c.ref_words:6d} | "
                     f"{_fmt_values(_row_values(c, percent), not percent)} |")
        if i != len(names) - 1:
            lines.append(rule)
    lines.append("|" + "=" * inner + "|")
    label = "Sum/Avg" if percent else "Sum"
    lines.append(f"| {label:<{width}} | {total.segments:4d} {total.ref_words:6d} | "
                 f"{_fmt_values(_row_values(total, percent), not percent)} |")
    lines.append("|" + "=" * inner + "|")
    if names:
        cols = [[float(result.speakers[n].segments), float(result.speakers[n].ref_words),
                 *map(float, _row_values(result.speakers[n], percent))] for n in names]
        for label, fn in (("Mean", statistics.fmean),
                          ("S.D.", lambda v: statistics.stdev(v) if len(v) > 1 else 0.0),
                          ("Median", statistics.median)):
            vals = [fn([row[j] for row in cols]) for j in range(8)]
            lines.append(f"| {label:^{width}} | {vals[0]:4.1f} {vals[1]:6.1f} | "
                         f"{vals[2]:4.1f} " + " ".join(f"{v:6.1f}" for v in vals[3:]) + " |")
    lines.append("`" + "-" * inner + "'")
    # sclite centres the table on an 80-column page.
    indent = " " * max(0, (80 - (inner + 2)) // 2)
    return "\n".join(indent + x if x.startswith(("|", ",", "`")) else x for x in lines) + "\n"


def _ranked(counter: Counter, title: str) -> list[str]:
    total = sum(counter.values())
    lines = [f"{title:<33}Total                 ({total})",
             f"{'':33}With >=  1 occurrences ({len(counter)})", ""]
    ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
    for i, (key, n) in enumerate(ranked, start=1):
        lines.append(f"{i:4d}: {n:4d}  ->  {key}")
    lines += ["     -------", f"{total:9d}", "", "", ""]
    return lines


def detail_report(result: SystemResult) -> str:
    """The ``.dtl`` report: overall rates, then confusion pairs, insertions, deletions, ..."""
    t = result.total
    sent_sub = sent_del = sent_ins = 0
    conf: Counter = Counter()
    ins: Counter = Counter()
    dels: Counter = Counter()
    subs: Counter = Counter()
    false: Counter = Counter()
    for seg in result.segments:
        ops = {p.op for p in seg.path}
        sent_sub += SUB in ops
        sent_del += DEL in ops
        sent_ins += INS in ops
        for p in seg.path:
            if p.op == SUB:
                conf[f"{p.ref} ==> {p.hyp}"] += 1
                subs[p.ref] += 1
                false[p.hyp] += 1
            elif p.op == INS:
                ins[p.hyp] += 1
            elif p.op == DEL:
                dels[p.ref] += 1
    aligned = t.corr + t.sub + t.dels + t.ins
    lines = [f"DETAILED OVERALL REPORT FOR THE SYSTEM: {result.title}", "",
             "SENTENCE RECOGNITION PERFORMANCE", "",
             f" sentences {t.segments:41d}",
             f" with errors {_pct(t.sent_err, t.segments):30.1f}%   ({t.sent_err:4d})", "",
             f"   with substitions {_pct(sent_sub, t.segments):22.1f}%   ({sent_sub:4d})",
             f"   with deletions {_pct(sent_del, t.segments):24.1f}%   ({sent_del:4d})",
             f"   with insertions {_pct(sent_ins, t.segments):23.1f}%   ({sent_ins:4d})",
             "", "", "WORD RECOGNITION PERFORMANCE", "",
             f"Percent Total Error       = {_pct(t.err, t.ref_words):6.1f}%   ({t.err:4d})", "",
             f"Percent Correct           = {_pct(t.corr, t.ref_words):6.1f}%   ({t.corr:4d})", "",
             f"Percent Substitution      = {_pct(t.sub, t.ref_words):6.1f}%   ({t.sub:4d})",
             f"Percent Deletions         = {_pct(t.dels, t.ref_words):6.1f}%   ({t.dels:4d})",
             f"Percent Insertions        = {_pct(t.ins, t.ref_words):6.1f}%   ({t.ins:4d})",
             f"Percent Word Accuracy     = {100.0 - _pct(t.err, t.ref_words):6.1f}%",
             "", "",
             f"Ref. words                =           ({t.ref_words:4d})",
             f"Hyp. words                =           ({t.hyp_words:4d})",
             f"Aligned words             =           ({aligned:4d})", "",
             *_ranked(conf, "CONFUSION PAIRS"),
             *_ranked(ins, "INSERTIONS"),
             *_ranked(dels, "DELETIONS"),
             *_ranked(subs, "SUBSTITUTIONS"),
             "* NOTE: The 'Substitution' words are those reference words",
             "        for which the recognizer supplied an incorrect word.", "", "",
             *_ranked(false, "FALSELY RECOGNIZED"),
             "* NOTE: The 'Falsely Recognized' words are those hypothesis words",
             "        which the recognizer incorrectly substituted for a reference word."]
    return "\n".join(lines) + "\n"


def alignment_report(result: SystemResult) -> str:
    """A ``.pra``-like listing of every scored segment's alignment."""
    out = []
    counters: Counter = Counter()
    for seg in result.segments:
        n = counters[seg.speaker]
        counters[seg.speaker] += 1
        c = Counts()
        c.add_path(seg.path)
        ref, hyp, ev = [], [], []
        for p in seg.path:
            r = p.ref if p.op != INS else "*" * len(p.hyp)
            h = p.hyp if p.op != DEL else "*" * len(p.ref)
            if p.op in (SUB, INS, DEL):
                r, h = r.upper(), h.upper()
            w = max(len(r), len(h))
            ref.append(r.ljust(w))
            hyp.append(h.ljust(w))
            ev.append(("" if p.op == CORR else p.op).ljust(w))
        out += [f"id: ({seg.speaker}-{n:03d})", f"Labels: {seg.labels}", f"File: {seg.file}",
                f"Channel: {seg.channel}",
                f"Scores: (#C #S #D #I) {c.corr} {c.sub} {c.dels} {c.ins}",
                "REF:  " + " ".join(ref) + " ", "HYP:  " + " ".join(hyp) + " ",
                "Eval: " + " ".join(ev) + " ", ""]
    return "\n".join(out) + "\n"


def write_reports(result: SystemResult, out_dir: Path, name: str) -> None:
    """Write ``<name>.sys``, ``.raw``, ``.dtl`` and ``.pra`` into ``out_dir``."""
    out_dir = Path(out_dir)
    write_text(out_dir / f"{name}.sys", summary_table(result, percent=True))
    write_text(out_dir / f"{name}.raw", summary_table(result, percent=False))
    write_text(out_dir / f"{name}.dtl", detail_report(result))
    write_text(out_dir / f"{name}.pra", alignment_report(result))


def sum_row(result: SystemResult) -> str:
    """The ``| Sum/Avg |`` line of the ``.sys`` report."""
    for line in summary_table(result, percent=True).splitlines():
        if line.lstrip().startswith("| Sum/Avg"):
            return line
    raise AssertionError("no Sum/Avg row")
