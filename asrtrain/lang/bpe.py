"""Sentencepiece output units for CTC models, trained on the training transcripts.

Non-speech tokens of the transcripts (``[noise]``, ``[laughter]``, ``[vocalized-noise]``, ``<unk>``)
become user-defined symbols: one unit each, never split into characters.
"""

from __future__ import annotations

import io
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import sentencepiece as spm

from asrtrain import AsrtrainError
from asrtrain.fileio import atomic_open

log = logging.getLogger(__name__)

NONSPEECH = re.compile(r"^(\[[^\]]+\]|<[^>]+>)$")


def nonspeech_symbols(texts: Iterable[str]) -> list[str]:
    """The bracketed non-speech tokens that occur in ``texts``, sorted."""
    return sorted({w for t in texts for w in t.split() if NONSPEECH.match(w)})


def train_units(texts: list[str], model_path: str | Path, vocab_size: int = 100,
                model_type: str = "char") -> Path:
    """Train a sentencepiece model of ``model_type`` (char, bpe, unigram) on ``texts``."""
    if not texts:
        raise AsrtrainError(f"{model_path}: no training text for the sentencepiece model")
    model_path = Path(model_path)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size,
        model_type=model_type, character_coverage=1.0, hard_vocab_limit=model_type != "char",
        user_defined_symbols=nonspeech_symbols(texts), unk_id=1, bos_id=-1, eos_id=-1,
        pad_id=0, pad_piece="<blk>", num_threads=1, minloglevel=2,
    )
    with atomic_open(model_path, "wb") as f:
        f.write(buf.getvalue())
    sp = Units(model_path)
    log.info("%s: %d %s units", model_path, len(sp), model_type)
    return model_path


class Units:
    """A trained unit inventory: id 0 is the CTC blank (sentencepiece's pad piece)."""

    def __init__(self, model_path: str | Path) -> None:
        model_path = Path(model_path)
        if not model_path.is_file():
            raise AsrtrainError(f"{model_path}: no sentencepiece model (run the lang stage)")
        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.blank = self.sp.pad_id()
        if self.blank != 0:
            raise AsrtrainError(f"{model_path}: the blank (pad) piece must have id 0")

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: list[int]) -> str:
        # <unk> is dropped rather than spelled as sentencepiece's " ⁇ " inside a word.
        return self.sp.decode([i for i in ids if i not in (self.blank, self.sp.unk_id())])

    def piece(self, i: int) -> str:
        return self.sp.id_to_piece(i)

    def starts_word(self, i: int) -> bool:
        return self.sp.id_to_piece(i).startswith("\u2581")


def uncovered_characters(units: Units, texts: Mapping[str, str]) -> tuple[Counter, list[str]]:
    """The characters of ``texts`` (utterance -> words) that no unit covers, counted, and the
    utterances that hold them: sentencepiece turns them into ``<unk>`` without a word, so a
    transcript in another case or script than the training text would train on nothing."""
    keys = list(texts)
    lines = [texts[k] for k in keys]
    unk = units.sp.unk_id()
    counts: Counter = Counter()
    utts = []
    for key, ids, pieces in zip(keys, units.sp.encode(lines), units.sp.encode(lines, out_type=str),
                                strict=True):
        unknown = "".join(p for i, p in zip(ids, pieces, strict=True) if i == unk)
        unknown = unknown.replace("\u2581", "").replace(" ", "")
        if unknown:
            counts.update(unknown)
            utts.append(key)
    return counts, utts
