"""Lexicon FSTs (Kaldi's ``utils/lang/make_lexicon_fst.py``) and small kaldifst helpers.

L maps position-dependent phones to words.  Optional silence: from the loop state each word
returns either directly (cost ``-log(1 - sil_prob)``) or through the silence state, which emits the
optional-silence phone (cost ``-log(sil_prob)``); the start state offers the same choice, so an
utterance may begin with silence.  In ``L_disambig`` pronunciations end in their ``#k`` symbol, the
silence arc is followed by its own disambiguation symbol, and a ``#0:#0`` self-loop sits on the
loop state so G's back-off ``#0`` passes through.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import kaldifst

from asrtrain.lang.phones import PhoneSet, SymbolTable


def make_lexicon_fst(prons: Iterable, ps: PhoneSet, words: SymbolTable, sil_prob: float,
                     disambig: bool) -> kaldifst.StdVectorFst:
    """Build L (or L_disambig) from :class:`asrtrain.lang.lexicon.Pronunciation` entries."""
    sil_cost = -math.log(sil_prob)
    no_sil_cost = -math.log(1.0 - sil_prob)
    fst = kaldifst.StdVectorFst()
    start, loop, sil = fst.add_state(), fst.add_state(), fst.add_state()
    fst.start = start
    sil_phone = ps.phones[ps.optional_silence]
    fst.add_arc(start, kaldifst.StdArc(0, 0, no_sil_cost, loop))
    fst.add_arc(start, kaldifst.StdArc(0, 0, sil_cost, sil))
    if disambig:
        # The last disambiguation symbol is reserved for the silence arc (as prepare_lang.sh does).
        mid = fst.add_state()
        fst.add_arc(sil, kaldifst.StdArc(sil_phone, 0, 0.0, mid))
        fst.add_arc(mid, kaldifst.StdArc(ps.phones[ps.disambig[-1]], 0, 0.0, loop))
    else:
        fst.add_arc(sil, kaldifst.StdArc(sil_phone, 0, 0.0, loop))
    for pron in prons:
        labels = [ps.phones[p] for p in pron.phones]
        if disambig and pron.disambig:
            labels.append(ps.phones[pron.disambig])
        word = words[pron.word]
        cur = loop
        for i, label in enumerate(labels[:-1]):
            nxt = fst.add_state()
            fst.add_arc(cur, kaldifst.StdArc(label, word if i == 0 else 0, 0.0, nxt))
            cur = nxt
        out = word if len(labels) == 1 else 0
        fst.add_arc(cur, kaldifst.StdArc(labels[-1], out, no_sil_cost, loop))
        fst.add_arc(cur, kaldifst.StdArc(labels[-1], out, sil_cost, sil))
    fst.set_final(loop, 0.0)
    if disambig:
        fst.add_arc(loop, kaldifst.StdArc(ps.phones["#0"], words["#0"], 0.0, loop))
    kaldifst.arcsort(fst, sort_type="olabel")
    return fst


def arcs(fst: kaldifst.StdVectorFst) -> list[tuple[int, int, int, float, int]]:
    """All arcs as ``(state, ilabel, olabel, weight, nextstate)`` (for tests and small graphs)."""
    out = []
    for s in kaldifst.StateIterator(fst):
        for a in kaldifst.ArcIterator(fst, s):
            out.append((s, a.ilabel, a.olabel, float(a.weight.value), a.nextstate))
    return out


def best_path_labels(fst: kaldifst.StdVectorFst) -> tuple[list[int], list[int], float]:
    """Input labels, output labels (epsilons removed) and cost of the shortest path."""
    path = kaldifst.shortest_path(fst)
    ok, ilabels, olabels, weight = kaldifst.get_linear_symbol_sequence(path)
    if not ok:
        raise ValueError("shortest path is not linear")
    return ([i for i in ilabels if i], [o for o in olabels if o], float(weight.value))
