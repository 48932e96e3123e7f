"""prepare_lang (phones, words, disambiguation, L.fst) and the Kneser-Ney LM / G.fst."""

from __future__ import annotations

import math
from pathlib import Path

import kaldifst
import pytest

from asrtrain import AsrtrainError
from asrtrain.lang.fst import arcs, best_path_labels
from asrtrain.lang.lexicon import Lang, prepare_lang
from asrtrain.lang.ngram import read_arpa, sentence_logprob, train_lm
from asrtrain.lang.phones import SymbolTable

LEXICON = """\
[noise] nsn
[laughter] lau
[vocalized-noise] spn
<unk> spn
a ah
the d ah
cat k ah t
cab k ah b
dog d ao g
dog d ah g
do d ao
"""


def make_dict(root: Path, lexicon: str = LEXICON) -> Path:
    d = root / "dict"
    d.mkdir(parents=True, exist_ok=True)
    (d / "silence_phones.txt").write_text("sil\nspn\nnsn\nlau\n")
    (d / "nonsilence_phones.txt").write_text("ah\nb\nk\nt\nd\nao\ng\n")
    (d / "optional_silence.txt").write_text("sil\n")
    (d / "extra_questions.txt").write_text("sil spn nsn lau\nah ao\n")
    (d / "lexicon.txt").write_text(lexicon)
    return d


@pytest.fixture(scope="module")
def lang_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lang")
    prepare_lang(make_dict(root), root / "lang")
    return root / "lang"


def test_phones_and_words_tables(lang_dir: Path) -> None:
    phones = SymbolTable.read(lang_dir / "phones.txt")
    assert phones.id2sym[:6] == ["<eps>", "sil", "sil_B", "sil_E", "sil_I", "sil_S"]
    assert "ah_B" in phones and "ah" not in phones   # non-silence phones only with positions
    words = SymbolTable.read(lang_dir / "words.txt")
    assert words.id2sym[0] == "<eps>" and words.id2sym[-3:] == ["#0", "<s>", "</s>"]
    # homophones spn_S get #1 #2; #3 is the silence disambiguator; nothing else needs one
    lex = (lang_dir / "lexicon_disambig.txt").read_text().splitlines()
    assert "[vocalized-noise] spn_S #1" in lex and "<unk> spn_S #2" in lex
    assert "the d_B ah_E" in lex
    assert (lang_dir / "phones" / "disambig.txt").read_text().split() == ["#0", "#1", "#2", "#3"]
    lang = Lang.read(lang_dir)
    assert lang.lexicon["dog"] == [("d_B", "ao_I", "g_E"), ("d_B", "ah_I", "g_E")]
    assert "<ForPhones>" in (lang_dir / "topo").read_text()


def test_lexicon_fst_maps_phones_to_words_with_optional_silence(lang_dir: Path) -> None:
    lang = Lang.read(lang_dir)
    L = kaldifst.StdVectorFst.read(str(lang_dir / "L.fst"))
    p, w = lang.phones.phones, lang.words
    seq = ["sil", "d_B", "ah_E", "d_B", "ah_I", "g_E", "sil"]   # "the dog" with silences
    A = kaldifst.make_linear_acceptor([p[s] for s in seq])
    _, words, cost = best_path_labels(kaldifst.compose(A, L))
    assert words == [w["the"], w["dog"]]
    # start silence, no silence after "the", silence after "dog": 3 x 0.5 choices -> 3 * log 2
    assert cost == pytest.approx(3 * math.log(2), abs=1e-4)
    bad = kaldifst.make_linear_acceptor([p["d_B"], p["ah_I"]])
    assert kaldifst.compose(bad, L).num_states == 0


def test_lg_with_disambig_is_determinizable(lang_dir: Path, tmp_path: Path) -> None:
    train_lm(["the dog", "the cat", "a dog", "a cab", "[noise] the cat"], lang_dir,
             tmp_path / "lm", order=2)
    L = kaldifst.StdVectorFst.read(str(lang_dir / "L_disambig.fst"))
    G = kaldifst.StdVectorFst.read(str(tmp_path / "lm" / "G.fst"))
    LG = kaldifst.compose(L, G)
    assert not kaldifst.determinize_star(LG)   # False: completed, not stopped early
    # deterministic on input: no state has two arcs with the same input label
    seen = set()
    for s, ilabel, *_ in arcs(LG):
        assert (s, ilabel) not in seen
        seen.add((s, ilabel))


def test_bad_dict_is_reported_with_file(tmp_path: Path) -> None:
    d = make_dict(tmp_path, LEXICON + "zebra z iy\n")
    with pytest.raises(AsrtrainError, match="lexicon.txt.*zebra.*unknown phone z"):
        prepare_lang(d, tmp_path / "lang")
    (d / "lexicon.txt").write_text(LEXICON + "lonely\n")
    with pytest.raises(AsrtrainError, match=r"lexicon.txt:12: word lonely has no pronunciation"):
        prepare_lang(d, tmp_path / "lang")
    assert not (tmp_path / "lang").exists()


def test_kneser_ney_arpa_and_g_fst(lang_dir: Path, tmp_path: Path) -> None:
    text = ["the dog", "the cat", "a dog", "the dog", "a cab", "zebra the cat"]
    g_path = train_lm(text, lang_dir, tmp_path / "lm", order=3)
    arpa = read_arpa(tmp_path / "lm" / "lm.arpa")
    assert ("<unk>",) in arpa                      # zebra is OOV and became <unk>
    assert max(len(k) for k in arpa) == 3
    words = [w for (w,) in (k for k in arpa if len(k) == 1) if w != "<s>"]
    for hist in [(), ("<s>",), ("<s>", "the")]:
        total = sum(math.exp(sentence_logprob_next(arpa, hist, w)) for w in words)
        assert total == pytest.approx(1.0, abs=2e-3)
    # G's best path for a sentence costs -log P(sentence) (kaldilm drops <s>, keeps </s>)
    G = kaldifst.StdVectorFst.read(str(g_path))
    wt = SymbolTable.read(lang_dir / "words.txt")
    A = kaldifst.make_linear_acceptor([wt["the"], wt["cat"]])
    _, out, cost = best_path_labels(kaldifst.compose(A, G))
    assert out == [wt["the"], wt["cat"]]
    assert cost == pytest.approx(-sentence_logprob(arpa, "the cat", 3), abs=1e-3)
    # pruning keeps a valid model with fewer n-grams
    train_lm(text * 3, lang_dir, tmp_path / "lm4", order=4, prune_threshold=0.05)
    pruned = read_arpa(tmp_path / "lm4" / "lm.pruned.arpa")
    assert len(pruned) < len(read_arpa(tmp_path / "lm4" / "lm.arpa"))
    assert (tmp_path / "lm4" / "G.fst").is_file()


def sentence_logprob_next(arpa, hist: tuple[str, ...], w: str) -> float:
    """ln P(w | hist) by back-off, for the normalization check."""
    lp = 0.0
    while (*hist, w) not in arpa:
        lp += arpa.get(hist, (0.0, 0.0))[1]
        hist = hist[1:]
    return (lp + arpa[(*hist, w)][0]) * math.log(10)


def test_lm_rejects_oov_without_unk(tmp_path: Path) -> None:
    lex = "\n".join(ln for ln in LEXICON.splitlines() if not ln.startswith("<unk>")) + "\n"
    prepare_lang(make_dict(tmp_path, lex), tmp_path / "lang")
    with pytest.raises(AsrtrainError, match="sentence 2: word 'zebra'"):
        train_lm(["the dog", "zebra"], tmp_path / "lang", tmp_path / "lm")
