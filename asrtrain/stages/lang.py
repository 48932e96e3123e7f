"""Stage ``lang``: Kaldi's prepare_dict (your own corpus's lexicon to ``data/local/dict``) and
prepare_lang from the dict dir (when there is one), and the sentencepiece units of the CTC model.

The units are a part of their own (``lang:units``, what the CTC stages read): their digest holds
``lang.vocab_size`` and ``lang.unit_type`` only, so a lexicon given, changed or edited, or a
``lang.sil_prob`` change, reruns this stage with ``units.model`` kept byte for byte, and the CTC
model is not retrained.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets
from asrtrain.sections import DatadirCorpus, corpus_settings, sets_settings
from asrtrain.settings import choice, integer, number, opt, read

log = logging.getLogger("asrtrain")

#: The config keys the units depend on (the ``units`` part's digest).
UNITS_KEYS = ("lang.vocab_size", "lang.unit_type")
#: What the units part writes into the lang dir, and the file that holds its digest.
UNITS_FILES = ("units.model",)
UNITS_DIGEST = ".units.digest"


def run(ctx: StageContext) -> None:
    from asrtrain.data.datadir import DataDir
    from asrtrain.fileio import atomic_open, write_text
    from asrtrain.lang.bpe import train_units

    cfg, paths = ctx.cfg, ctx.paths
    train = DataDir.read(paths.data_set(sets_settings(cfg).train))
    texts = [train.text[u] for u in train.utts]
    if _is_datadir(cfg):
        _prepare_dict(cfg, train, paths.dict_dir)
    units_key = ctx.parts["units"]
    kept = _units_kept(paths.lang, units_key, ctx.fresh)
    if (paths.dict_dir / "lexicon.txt").is_file():
        from asrtrain.lang.lexicon import prepare_lang

        # prepare_lang builds the whole directory anew, so it comes first.
        prepare_lang(paths.dict_dir, paths.lang, sil_prob=float(cfg.lang.sil_prob))
    else:
        words = sorted({w for t in texts for w in t.split()})
        with atomic_open(paths.lang / "words.txt", "w", encoding="utf-8") as f:
            f.write("".join(f"{w} {i}\n" for i, w in enumerate(["<eps>", *words])))
        log.info("lang: no dict dir, so no lexicon: %d words in %s", len(words), paths.lang)
    if kept is not None:
        for name, content in kept.items():
            with atomic_open(paths.lang / name, "wb") as f:
                f.write(content)
        log.info("lang: the units are as before (%s unchanged): %s kept", ", ".join(UNITS_KEYS),
                 paths.lang / "units.model")
    else:
        train_units(texts, paths.lang / "units.model", vocab_size=int(cfg.lang.vocab_size),
                    model_type=str(cfg.lang.unit_type))
    write_text(paths.lang / UNITS_DIGEST, units_key + "\n")
    warn_uncovered(ctx)


def _units_kept(lang: Path, key: str, fresh: bool) -> dict[str, bytes] | None:
    """The units files made for ``key`` before, to keep as they are; None: make them anew."""
    marker = lang / UNITS_DIGEST
    if fresh or not marker.is_file() or marker.read_text().strip() != key:
        return None
    if not all((lang / f).is_file() for f in UNITS_FILES):
        return None
    return {f: (lang / f).read_bytes() for f in UNITS_FILES}


def _is_datadir(cfg: DictConfig) -> bool:
    return isinstance(corpus_settings(cfg), DatadirCorpus)


def _corpus(cfg: DictConfig) -> DatadirCorpus:
    corpus = corpus_settings(cfg)
    assert isinstance(corpus, DatadirCorpus), "your own corpus's lexicon: kind datadir only"
    return corpus


def _user_text(cfg: DictConfig) -> Path:
    """The training text as the user gave it (named in the lexicon's messages)."""
    where = (_corpus(cfg).sets or {}).get(sets_settings(cfg).train)
    return Path(str(where)) / "text" if where else Path("text")


def _prepare_dict(cfg: DictConfig, train, dict_dir: Path) -> None:
    """Your own corpus: the dict dir from ``corpus.lexicon`` or ``corpus.dict_dir``, its
    coverage of the training text checked (Kaldi's local/prepare_dict.sh); none without one."""
    from asrtrain.data.corpora.datadir import user_dict_files, write_dict_dir

    files = user_dict_files(_corpus(cfg), train, _user_text(cfg))
    write_dict_dir(files, dict_dir)
    if files is not None:
        corpus = _corpus(cfg)
        log.info("lang: the lexicon is %s (%d entries) -> %s",
                 corpus.lexicon or f"the dict dir {corpus.dict_dir}",
                 files["lexicon.txt"].count(b"\n"), dict_dir)


@dataclass(frozen=True)
class LangConfig:
    """The ``lang`` section (``conf/lang/bpe500.yaml``), read by :func:`asrtrain.settings.read`:
    the CTC units (sentencepiece ``unit_type`` char | bpe | unigram, ``vocab_size``) and
    ``prepare_lang``'s ``sil_prob``."""

    unit_type: str = opt("bpe", choice("char", "bpe", "unigram"))
    vocab_size: int = opt(500, integer(1))
    sil_prob: float = opt(0.5, number(0.0, 1.0))


def check(cfg: DictConfig) -> None:
    """The ``lang`` section; your own corpus's lexicon, before any stage starts: the options,
    the file there, and with ``corpus.oov=error`` the training words it lacks (refused before
    anything is written)."""
    read(LangConfig, cfg.get("lang"), "lang")
    if not _is_datadir(cfg):
        return
    from asrtrain.data.corpora.datadir import lexicon_files, read_dict_dir, user_dict_files
    from asrtrain.data.datadir import DataDir

    corpus = _corpus(cfg)   # its keys and types checked (asrtrain.sections)
    if corpus.dict_dir and not corpus.lexicon:
        read_dict_dir(Path(corpus.dict_dir))
    missing = [p for p in lexicon_files(corpus) if not p.is_file()]
    if missing and corpus.lexicon:
        from asrtrain import AsrtrainError

        raise AsrtrainError(f"corpus.lexicon={corpus.lexicon}: no such file; give a lexicon "
                            "of 'WORD PHONE ...' lines, cmudict, or corpus.dict_dir=DIR")
    text = _user_text(cfg)
    if corpus.oov == "error" and text.is_file():
        user_dict_files(corpus, DataDir.read(text.parent), text)


def user_files(cfg: DictConfig) -> list[Path]:
    """Your own corpus's lexicon file or dict dir files, which enter the digest by content."""
    from asrtrain.data.corpora.datadir import lexicon_files

    return lexicon_files(_corpus(cfg)) if _is_datadir(cfg) else []


def warn_uncovered(ctx: StageContext) -> None:
    """One warning per data set whose text the model must learn or be scored on (train, dev,
    test sets without an stm) and holds characters outside the units: they become <unk>."""
    from asrtrain.data.datadir import DataDir
    from asrtrain.lang.bpe import Units, uncovered_characters

    cfg, paths = ctx.cfg, ctx.paths
    units = Units(paths.lang / "units.model")
    sets = sets_settings(cfg)
    for name in data_sets(cfg):
        where = paths.data_set(name)
        if name not in (sets.train, sets.dev) and (where / "stm").is_file():
            continue   # scored against its stm (through the GLM), not its text
        data = DataDir.read(where)
        counts, utts = uncovered_characters(units, data.text)
        if counts:
            common = sorted(counts.items(), key=lambda cn: (-cn[1], cn[0]))[:5]
            log.warning("%s/text: %d characters in %d of %d utterances are not among the %d %s "
                        "units (they become <unk>): %s; first in utterance %s (line %d)", where,
                        sum(counts.values()), len(utts), len(data.text), len(units),
                        cfg.lang.unit_type, ", ".join(f"{c!r} x{n}" for c, n in common),
                        utts[0], data.lines["text"][utts[0]])


# corpus.lexicon, corpus.dict_dir, corpus.oov: your own corpus's lexicon, made into the dict dir
# here (the LDC corpora's prepare stage writes theirs: their lang digest holds ``lang`` only).
LEXICON_KEYS = ("lexicon", "dict_dir", "oov")
def _config(cfg: DictConfig) -> dict:
    from asrtrain.pipeline import select

    keys = ("lang", *(f"corpus.{k}" for k in LEXICON_KEYS)) if _is_datadir(cfg) else ("lang",)
    return {k: select(cfg, k) for k in keys}


STAGE = Stage("lang", run, reads=("prepare",), config=_config,
              check=check, files=user_files, parts={"units": UNITS_KEYS},
              doc="dict dir (your own lexicon), phones, words.txt, L.fst; sentencepiece units")
