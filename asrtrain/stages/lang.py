"""Stage ``lang``: Kaldi's prepare_lang from the dict dir (when there is one) and the
sentencepiece units of the CTC model."""

from __future__ import annotations

import logging

from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import data_sets

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.data.datadir import DataDir
    from asrtrain.fileio import atomic_open
    from asrtrain.lang.bpe import train_units

    cfg, paths = ctx.cfg, ctx.paths
    train = DataDir.read(paths.data_set(cfg.sets.train))
    texts = [train.text[u] for u in train.utts]
    if (paths.dict_dir / "lexicon.txt").is_file():
        from asrtrain.lang.lexicon import prepare_lang

        # prepare_lang builds the whole directory anew, so it comes first.
        prepare_lang(paths.dict_dir, paths.lang, sil_prob=float(cfg.lang.sil_prob))
    else:
        words = sorted({w for t in texts for w in t.split()})
        with atomic_open(paths.lang / "words.txt", "w", encoding="utf-8") as f:
            f.write("".join(f"{w} {i}\n" for i, w in enumerate(["<eps>", *words])))
        log.info("lang: no dict dir, so no lexicon: %d words in %s", len(words), paths.lang)
    train_units(texts, paths.lang / "units.model", vocab_size=int(cfg.lang.vocab_size),
                model_type=str(cfg.lang.unit_type))
    warn_uncovered(ctx)


def warn_uncovered(ctx: StageContext) -> None:
    """One warning per data set whose text the model must learn or be scored on (train, dev,
    test sets without an stm) and holds characters outside the units: they become <unk>."""
    from asrtrain.data.datadir import DataDir
    from asrtrain.lang.bpe import Units, uncovered_characters

    cfg, paths = ctx.cfg, ctx.paths
    units = Units(paths.lang / "units.model")
    for name in data_sets(cfg):
        where = paths.data_set(name)
        if name not in (cfg.sets.train, cfg.sets.dev) and (where / "stm").is_file():
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


STAGE = Stage("lang", run, reads=("prepare",), config=("lang",),
              doc="phones, words.txt, L.fst from the dict dir; sentencepiece units")
