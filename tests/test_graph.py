"""HCLG construction: H from a context-dependent tree, composed with C, L and G, checked by
composing HCLG with the transition-state sequence of a sentence and reading the words back."""

from __future__ import annotations

import json
from pathlib import Path

import kaldifst
import numpy as np
import pytest
import torch
from test_lang import make_dict  # the tests dir is on sys.path under pytest

from asrtrain.align.gmm import DiagGmmSet
from asrtrain.align.model import AcousticModel, initial_log_trans
from asrtrain.align.tree import KEY_PDF_CLASS, Tree, mono_tree
from asrtrain.decode.graph import make_graph
from asrtrain.lang.fst import best_path_labels
from asrtrain.lang.lexicon import Lang, prepare_lang
from asrtrain.lang.ngram import train_lm
from asrtrain.lang.phones import SymbolTable


def context_tree(lang: Lang) -> Tree:
    """The monophone tree, except that the middle state of "ah" depends on the left phone
    (after d_B: its own pdf), so a wrong context in C or H would change the labels."""
    ps = lang.phones
    states = {p: ps.topology(p).num_states for p in ps.real_phone_ids}
    tree = mono_tree(ps.root_of(), states)
    root = ps.root_of()[ps.phones["ah_B"]]
    nodes = list(tree.nodes)
    new_pdf = tree.num_pdfs
    nodes.append(("leaf", new_pdf))
    yes_leaf = len(nodes) - 1
    old_root = tree.roots[root]
    # is pdf-class 1 and left == d_B ?  -> new leaf; otherwise the old monophone subtree
    nodes.append(("split", 0, frozenset({ps.phones["d_B"]}), yes_leaf, old_root))
    ctx = len(nodes) - 1
    nodes.append(("split", KEY_PDF_CLASS, frozenset({1}), ctx, old_root))
    roots = dict(tree.roots)
    roots[root] = len(nodes) - 1
    return Tree(nodes, roots, tree.root_of, new_pdf + 1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("graph")
    prepare_lang(make_dict(root), root / "lang")
    lang = Lang.read(root / "lang")
    train_lm(["the cat", "the dog", "a cat", "a cab", "the cab do"], root / "lang", root / "lm",
             order=2)
    tree = context_tree(lang)
    p = tree.num_pdfs
    gmm = DiagGmmSet(torch.zeros(p, 1, 2), torch.ones(p, 1, 2), torch.zeros(p, 1))
    model = AcousticModel(tree, gmm, initial_log_trans(lang), 2, np.full(2, 0.01))
    model.save(root / "model", lang.phones.phones.id2sym)
    info = make_graph(root / "lang", root / "lm", root / "model", root / "graph")
    return {"root": root, "lang": lang, "model": model, "info": info}


def tstate_labels(setup: dict, phones: list[str]) -> list[int]:
    """Each HMM state of each phone entered once, with the context-dependent pdfs."""
    graph = setup["root"] / "graph"
    table = {}
    for line in (graph / "tstates.txt").read_text().splitlines():
        label, phone, state, pdf = map(int, line.split())
        table[(phone, state, pdf)] = label
    ids = [setup["lang"].phones.phones[p] for p in phones]
    out = []
    for i, p in enumerate(ids):
        left = ids[i - 1] if i else 0
        right = ids[i + 1] if i + 1 < len(ids) else 0
        n = setup["lang"].phones.topology(p).num_states
        for s in range(n):
            out.append(table[(p, s, setup["model"].tree.pdf(left, p, right, s))])
    return out


@pytest.mark.parametrize("phones,words", [
    (["d_B", "ah_E", "k_B", "ah_I", "t_E"], ["the", "cat"]),
    (["sil", "ah_S", "sil", "k_B", "ah_I", "b_E", "sil"], ["a", "cab"]),
    (["d_B", "ah_E", "k_B", "ah_I", "b_E", "d_B", "ao_E"], ["the", "cab", "do"]),
])
def test_hclg_reads_back_the_words(setup, phones, words) -> None:
    hclg = kaldifst.StdVectorFst.read(str(setup["root"] / "graph" / "HCLG.fst"))
    acceptor = kaldifst.make_linear_acceptor(tstate_labels(setup, phones))
    kaldifst.arcsort(hclg, sort_type="ilabel")
    _, out, _ = best_path_labels(kaldifst.compose(acceptor, hclg))
    wt = SymbolTable.read(setup["root"] / "graph" / "words.txt")
    assert [wt.id2sym[o] for o in out] == words


def test_hclg_uses_the_context_dependent_pdf(setup) -> None:
    """'ah' after d_B has its own middle-state pdf: H holds it wherever C says the left phone is
    d_B ("the", "dog") and the monophone pdf elsewhere ("cat", "cab")."""
    lang, model = setup["lang"], setup["model"]
    ph = lang.phones.phones
    new_pdf = model.tree.pdf(ph["d_B"], ph["ah_E"], 0, 1)
    mono_pdf = model.tree.pdf(0, ph["ah_E"], 0, 1)
    assert new_pdf != mono_pdf
    table = set()
    for line in (setup["root"] / "graph" / "tstates.txt").read_text().splitlines():
        _, phone, state, pdf = map(int, line.split())
        table.add((phone, state, pdf))
    assert (ph["ah_E"], 1, new_pdf) in table and (ph["ah_E"], 1, mono_pdf) not in table
    assert (ph["ah_I"], 1, new_pdf) in table and (ph["ah_I"], 1, mono_pdf) in table


def test_self_loops_and_no_disambiguation_symbols_left(setup) -> None:
    """Staying in states costs frames: repeating labels is accepted; only transition-state
    labels remain on the input side (no #k; as in Kaldi, removing them may leave a few
    non-deterministic states)."""
    graph: Path = setup["root"] / "graph"
    info = json.loads((graph / "info.json").read_text())
    hclg = kaldifst.StdVectorFst.read(str(graph / "HCLG.fst"))
    labels = tstate_labels(setup, ["d_B", "ah_E", "k_B", "ah_I", "t_E"])
    slow = [x for x in labels for _ in range(3)]
    _, out, _ = best_path_labels(kaldifst.compose(kaldifst.make_linear_acceptor(slow), hclg))
    assert len(out) == 2
    used = set()
    for s in kaldifst.StateIterator(hclg):
        for a in kaldifst.ArcIterator(hclg, s):
            assert 0 <= a.ilabel <= info["num_tstates"]
            used.add(a.ilabel)
    assert used - {0} == set(range(1, info["num_tstates"] + 1))


def test_decode_needs_a_graph(setup, tmp_path) -> None:
    from asrtrain import AsrtrainError
    from asrtrain.decode.graph import decode_gmm

    with pytest.raises(AsrtrainError, match="HCLG.fst: missing"):
        (tmp_path / "g").mkdir()
        (tmp_path / "g" / "info.json").write_text("{}")
        decode_gmm(setup["root"] / "model", tmp_path / "g", tmp_path / "data", tmp_path / "out")


def test_gmm_decode_config() -> None:
    """GmmDecodeConfig: the defaults of decode_gmm in one place; bad options are errors."""
    from asrtrain import AsrtrainError
    from asrtrain.decode import GmmDecodeConfig

    c = GmmDecodeConfig.from_config(None)
    assert (c.acoustic_scales, c.beam, c.max_active) == ((1 / 12, 0.1), 13.0, 7000)
    assert GmmDecodeConfig.from_config({"acoustic_scales": [0.1], "beam": 10}).beam == 10.0
    for bad, message in (({"acoustic_scale": 0.1}, r"gmm decode.acoustic_scale: unknown setting"),
                         ({"acoustic_scales": []}, r"gmm decode.acoustic_scales=\[\]: "
                                                   "expected a list of at least 1"),
                         ({"acoustic_scales": [0.1, -1]}, r"gmm decode.acoustic_scales\[1\]=-1.0: "
                                                          "expected a number > 0"),
                         ({"max_active": "many"}, "gmm decode.max_active='many': expected an "
                                                  "integer"),
                         ({"max_active": 0}, "gmm decode.max_active=0: expected an integer >= 1"),
                         ({"beam": 0}, "gmm decode.beam=0.0: expected a number > 0"),
                         ({"self_loop_scale": -0.1}, "gmm decode.self_loop_scale=-0.1: expected "
                                                     "a number >= 0")):
        with pytest.raises(AsrtrainError, match=message):
            GmmDecodeConfig.from_config(bad)
    # the section a stage reads them from is named (decode_gmm: align.decode_options)
    with pytest.raises(AsrtrainError, match=r"^align.decode_options.beam=-2.0: expected"):
        GmmDecodeConfig.from_config({"beam": -2}, "align.decode_options")
    # built in code (not read from a config), the checks across values still hold
    with pytest.raises(AsrtrainError, match="need at least one"):
        GmmDecodeConfig(acoustic_scales=())
