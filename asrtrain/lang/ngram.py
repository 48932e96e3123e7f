"""Word n-gram LM: Kneser-Ney ARPA with kaldingram (SRILM-equivalent), then G.fst with kaldilm.

``train_lm`` writes ``lm_dir/lm.arpa`` (unpruned, interpolated modified Kneser-Ney, as
``ngram-count -kndiscount -interpolate``), optionally ``lm_dir/lm.pruned.arpa`` (relative-entropy
pruning, as ``ngram -prune``), and ``lm_dir/G.fst`` over ``lang_dir/words.txt`` with ``#0`` on the
back-off arcs and ``<s>``/``</s>`` turned into epsilons (Kaldi's ``arpa2fst --disambig-symbol=#0``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from kaldingram.prune import ArpaParser, prune
from kaldingram.train import NgramCounts

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.fileio import atomic_dir, write_text
from asrtrain.lang.phones import SymbolTable

log = logging.getLogger(__name__)

UNK = "<unk>"
MAX_DISCOUNT = 0.9


def _sentences(text: Iterable[str] | Path, words: SymbolTable) -> tuple[list[str], int]:
    """Normalize LM text against words.txt: an OOV word becomes <unk> when the lexicon has it,
    otherwise it is an error naming the line (a G over unknown words cannot be built)."""
    if isinstance(text, (str, os.PathLike)):
        path = Path(text)
        if not path.is_file():
            raise AsrtrainError(f"{path}: LM training text not found")
        with open(path, encoding="utf-8") as f:
            lines = [(f"{path}:{i}", ln) for i, ln in enumerate(f, 1)]
    else:
        lines = [(f"sentence {i}", ln) for i, ln in enumerate(text, 1)]
    out, oov = [], 0
    for where, line in lines:
        toks = line.split()
        if not toks:
            continue
        for i, w in enumerate(toks):
            if w not in words or w in ("<eps>", "#0", "<s>", "</s>"):
                if UNK not in words:
                    raise AsrtrainError(f"{where}: word {w!r} is not in words.txt and the lexicon "
                                        f"has no {UNK}")
                toks[i] = UNK
                oov += 1
        out.append(" ".join(toks))
    if not out:
        raise AsrtrainError("LM training text is empty")
    return out, oov


def train_lm(text: Iterable[str] | Path, lang_dir: Path, lm_dir: Path, order: int = 3,
             prune_threshold: float = 0.0) -> Path:
    """Train an ``order``-gram Kneser-Ney LM on ``text`` (sentences, or a file with one sentence
    per line, no utterance ids), write the ARPA and G.fst into ``lm_dir``; return G.fst's path.

    ``prune_threshold`` > 0 prunes with that relative-entropy threshold (SRILM ``-prune``; 1e-7 is
    a usual value for large 4-grams) and G is built from the pruned ARPA.
    """
    lang_dir, lm_dir = Path(lang_dir), Path(lm_dir)
    if not 1 <= order <= 5:
        raise AsrtrainError(f"LM order must be 1..5, got {order}")
    words = SymbolTable.read(lang_dir / "words.txt")
    sentences, oov = _sentences(text, words)
    counts = NgramCounts(order)
    for s in sentences:
        counts.add_raw_counts_from_line(s)
    with contextlib.redirect_stderr(io.StringIO()):   # kaldingram's tqdm bars
        counts.cal_discounting_constants()
        # D = n1 / (n1 + 2 n2) is 1 when no n-gram of an order was seen twice (small texts): every
        # seen n-gram would get probability 0 (log10 -99, SRILM refuses such orders). Cap it.
        counts.d = [min(d, MAX_DISCOUNT) for d in counts.d]
        counts.cal_f()
        counts.cal_bow()
    with atomic_dir(lm_dir) as tmp:
        arpa = tmp / "lm.arpa"
        with open(arpa, "w", encoding="utf-8") as f, contextlib.redirect_stderr(io.StringIO()):
            counts.print_as_arpa(fout=f)
        if prune_threshold > 0:
            lm = ArpaParser().loadf(str(arpa), encoding="utf-8")[0]
            with contextlib.redirect_stderr(io.StringIO()):   # tqdm bars
                prune(lm, prune_threshold, 1)
            ArpaParser().dumpf(lm, str(tmp / "lm.pruned.arpa"), encoding="utf-8")
            arpa = tmp / "lm.pruned.arpa"
        with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=tmp, delete=False) as f:
            f.write("".join(f"{s} {i}\n" for i, s in enumerate(words.id2sym)))
        arpa2fst(arpa, tmp / "G.fst", Path(f.name))
        os.unlink(f.name)
        write_text(tmp / "info", f"order {order}\nsentences {len(sentences)}\noov {oov}\n"
                                 f"prune_threshold {prune_threshold}\narpa {arpa.name}\n")
    log.info("LM: %d sentences, %d OOV tokens mapped to %s, order %d", len(sentences), oov, UNK,
             order)
    return lm_dir / "G.fst"


# kaldilm's arpa2fst with Kaldi's options for G (see the module docstring), run in a child.
_ARPA2FST = ("import sys, kaldilm; kaldilm.arpa2fst(sys.argv[1], sys.argv[2], "
             "disambig_symbol='#0', read_symbol_table=sys.argv[3])")


# kaldilm prefixes each message with the line of its C++ source that logged it, e.g.
# "/project/kaldilm/csrc/arpa_file_parser.cc:void kaldilm::ArpaFileParser::Read(...):79":
# a build machine's path, nothing a user can act on; the message line follows it.
_CXX_SOURCE = re.compile(r"^\S*\.(?:cc|cpp|h):.*:\d+$")


def arpa2fst(arpa: Path, fst: Path, symbols: Path) -> None:
    """Write G.fst from ``arpa`` with kaldilm, in a child process.

    kaldilm is C++ that logs (``[I] Reading \\data\\ section.``) straight to file descriptor 2,
    past Python's ``sys.stderr``, and calls ``abort()`` on a bad ARPA. In a child its stderr is a
    pipe: what it says goes to the stage log, not the console, and a failure becomes one error
    line naming the ARPA file instead of a dead process (the child costs a fraction of a
    second; G's compilation itself takes longer on any real LM).
    """
    proc = subprocess.run([sys.executable, "-c", _ARPA2FST, str(arpa), str(fst), str(symbols)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          errors="replace")
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines()
             if ln.strip() and not _CXX_SOURCE.match(ln)]
    for line in lines:
        log.info("kaldilm: %s", line, extra=STAGE_LOG_ONLY)
    if proc.returncode != 0:
        why = next((ln[3:].strip() for ln in reversed(lines) if ln.startswith(("[E]", "[F]"))),
                   lines[-1] if lines else f"exit status {proc.returncode}")
        raise AsrtrainError(f"{arpa}: kaldilm arpa2fst failed: {why}")


def read_arpa(path: Path) -> dict[tuple[str, ...], tuple[float, float]]:
    """ARPA n-grams -> (log10 prob, log10 back-off); for tests and inspection."""
    out: dict[tuple[str, ...], tuple[float, float]] = {}
    order = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("ngram ") or line in ("\\data\\", "\\end\\"):
                continue
            if line.startswith("\\") and line.endswith("-grams:"):
                order = int(line[1:].split("-")[0])
                continue
            parts = line.split()
            if order == 0 or len(parts) < order + 1:
                raise AsrtrainError(f"{path}:{lineno}: malformed ARPA line")
            bo = float(parts[order + 1]) if len(parts) > order + 1 else 0.0
            out[tuple(parts[1:order + 1])] = (float(parts[0]), bo)
    return out


def sentence_logprob(arpa: dict[tuple[str, ...], tuple[float, float]], sentence: str,
                     order: int) -> float:
    """Natural-log probability of a sentence (with <s> and </s>) under a back-off ARPA model."""
    toks = ["<s>", *sentence.split(), "</s>"]
    total = 0.0
    for i in range(1, len(toks)):
        hist = tuple(toks[max(0, i - order + 1):i])
        w = toks[i]
        lp = 0.0
        while (*hist, w) not in arpa:
            if not hist:
                raise KeyError(w)
            lp += arpa.get(hist, (0.0, 0.0))[1]
            hist = hist[1:]
        total += lp + arpa[(*hist, w)][0]
    return total * math.log(10)
