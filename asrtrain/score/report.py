"""sclite-style reports: ``.sys`` (percent by speaker), ``.raw`` (counts), ``.dtl`` (details).

The layout follows sclite's (``-o sum rsum dtl``) closely enough to be read by the same eyes and
the same scripts (Kaldi's ``grep Sum/Avg``); the ``Sum/Avg`` and ``Sum`` rows carry the same
numbers sclite prints.  sclite's NCE column (confidence entropy) is not produced.
"""

from __future__ import annotations

import math
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


def _f1(value: float, width: int) -> str:
    """One decimal, rounding halves up as sclite does (6.25 -> 6.3, where printf gives 6.2)."""
    return f"{math.floor(value * 10 + 0.5) / 10:{width}.1f}"


def _fmt_values(values: list[float], as_int: bool) -> str:
    # sclite: "%5.1f" then " %6.1f" (so 100.0 touches the bar, as in sclite's own tables)
    if as_int:
        return f"{int(values[0]):5d}" + "".join(f" {int(v):6d}" for v in values[1:])
    return _f1(values[0], 5) + "".join(" " + _f1(v, 6) for v in values[1:])


def _centre(text: str, width: int) -> str:
    # sclite puts the odd padding space on the right
    left = max(0, (width - len(text)) // 2)
    return " " * left + text + " " * max(0, width - len(text) - left)


def summary_table(result: SystemResult, percent: bool) -> str:
    """The ``.sys`` (percent=True) or ``.raw`` (percent=False) table."""
    names = sorted(result.speakers)
    total = result.total
    label = "Sum/Avg" if percent else "Sum"
    width = max([len(n) for n in names] + [len("SPKR"), len(label) - 1])
    header = f"| {'SPKR':<{width}} | # Snt # Wrd | Corr    Sub    Del    Ins    Err  S.Err |"
    inner = len(header) - 2
    rule = f"|-{'-' * width}-+-------------+-----------------------------------------|"

    def row(name: str, c: Counts) -> str:
        cell = (" " + name).ljust(width + 2)
        return (f"|{cell}|{c.segments:5d} {c.ref_words:6d} |"
                f"{_fmt_values(_row_values(c, percent), not percent)} |")

    lines = ["", "", "", "SYSTEM SUMMARY PERCENTAGES by SPEAKER".center(80), "",
             "," + "-" * inner + ".", "|" + _centre(result.title, inner) + "|",
             "|" + "-" * inner + "|", header, rule]
    for i, name in enumerate(names):
        lines.append(row(name, result.speakers[name]))
        if i != len(names) - 1:
            lines.append(rule)
    lines += ["|" + "=" * inner + "|", row(label, total), "|" + "=" * inner + "|"]
    if names:
        cols = [[float(result.speakers[n].segments), float(result.speakers[n].ref_words),
                 *map(float, _row_values(result.speakers[n], percent))] for n in names]
        for stat, fn in (("Mean", statistics.fmean),
                         ("S.D.", lambda v: statistics.stdev(v) if len(v) > 1 else 0.0),
                         ("Median", statistics.median)):
            vals = [fn([r[j] for r in cols]) for j in range(8)]
            lines.append(f"|{_centre(stat, width + 2)}|{_f1(vals[0], 5)} {_f1(vals[1], 6)} |"
                         f"{_fmt_values(vals[2:], False)} |")
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
    lines += ["     -------", f"{total:10d}", "", ""]
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
             f" sentences{t.segments:44d}",
             f" with errors{_f1(_pct(t.sent_err, t.segments), 33)}%   ({t.sent_err:4d})", "",
             f"   with substitions{_f1(_pct(sent_sub, t.segments), 26)}%   ({sent_sub:4d})",
             f"   with deletions{_f1(_pct(sent_del, t.segments), 28)}%   ({sent_del:4d})",
             f"   with insertions{_f1(_pct(sent_ins, t.segments), 27)}%   ({sent_ins:4d})",
             "", "", "WORD RECOGNITION PERFORMANCE", "",
             f"Percent Total Error       = {_f1(_pct(t.err, t.ref_words), 6)}%   ({t.err:4d})", "",
             f"Percent Correct           = {_f1(_pct(t.corr, t.ref_words), 6)}%   ({t.corr:4d})",
             "",
             f"Percent Substitution      = {_f1(_pct(t.sub, t.ref_words), 6)}%   ({t.sub:4d})",
             f"Percent Deletions         = {_f1(_pct(t.dels, t.ref_words), 6)}%   ({t.dels:4d})",
             f"Percent Insertions        = {_f1(_pct(t.ins, t.ref_words), 6)}%   ({t.ins:4d})",
             f"Percent Word Accuracy     = {_f1(100.0 - _pct(t.err, t.ref_words), 6)}%",
             "", "",
             f"Ref. words                =           ({t.ref_words:4d})",
             f"Hyp. words                =           ({t.hyp_words:4d})",
             f"Aligned words             =           ({aligned:4d})", "",
             *_ranked(conf, "CONFUSION PAIRS"), "",
             *_ranked(ins, "INSERTIONS"), "",
             *_ranked(dels, "DELETIONS"), "",
             *_ranked(subs, "SUBSTITUTIONS"),
             "* NOTE: The 'Substitution' words are those reference words",
             "        for which the recognizer supplied an incorrect word.", "", "",
             *_ranked(false, "FALSELY RECOGNIZED"),
             "* NOTE: The 'Falsely Recognized' words are those hypothesis words",
             "        which the recognizer incorrectly substituted for a reference word.", ""]
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

