"""Stage ``prepare``: the corpus (LDC layout, or the user's Kaldi data dirs) to Kaldi data dirs."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from asrtrain import AsrtrainError
from asrtrain.pipeline import Stage, StageContext
from asrtrain.recipe import Paths, data_sets
from asrtrain.sections import DatadirCorpus, corpus_settings, sets_settings

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.data.datadir import DataDir

    cfg, paths = ctx.cfg, ctx.paths
    written = _prepare_user_sets(cfg, paths) if _is_datadir(cfg) else _prepare_corpus(cfg, paths)
    for name in written:
        d = DataDir.read(paths.data_set(name))
        log.info("%s: %d utterances, %d speakers, %d recordings", paths.data_set(name),
                 len(d.utt2spk), len(d.spk2utt), len(d.wav))


def _prepare_corpus(cfg: DictConfig, paths: Paths) -> list[str]:
    from asrtrain.data.corpora import prepare_corpus

    corpus = corpus_settings(cfg)
    written = prepare_corpus(corpus, paths.data)
    missing = [s for s in data_sets(cfg) if s not in written]
    if missing:
        raise AsrtrainError(f"corpus {corpus.kind} gave the sets {written}, but the recipe "
                            f"needs {missing} (see sets: in the recipe)")
    return written


def _prepare_user_sets(cfg: DictConfig, paths: Paths) -> list[str]:
    """Your own data dirs: everything read and checked (a dev set split off when none is
    given, the lexicon's coverage of the training text) before anything is written."""
    from asrtrain.data.corpora.datadir import prepare_user_corpus

    user = prepare_user_corpus(_corpus(cfg), *_set_names(cfg))
    return user.write(paths.data)


def _is_datadir(cfg: DictConfig) -> bool:
    return isinstance(corpus_settings(cfg), DatadirCorpus)


def _corpus(cfg: DictConfig) -> DatadirCorpus:
    return corpus_settings(cfg)


def _set_names(cfg: DictConfig) -> tuple[str, str, list[str]]:
    sets = sets_settings(cfg)
    return sets.train, sets.dev, list(sets.test)


def check(cfg: DictConfig) -> None:
    """Your own data dirs: every set the recipe uses is given (or, the dev set, split off),
    checked before any stage starts, so a missing one stops the run before anything is copied."""
    if _is_datadir(cfg):
        from asrtrain.data.corpora.datadir import check_user_sets

        check_user_sets(_corpus(cfg), *_set_names(cfg))


def user_files(cfg: DictConfig) -> list:
    """Your own data dirs' tables, which enter the digest by content."""
    from asrtrain.data.corpora.datadir import table_files

    return table_files(_corpus(cfg)) if _is_datadir(cfg) else []




# The lexicon keys of your own corpus are the lang stage's (it makes the dict dir): adding a
# lexicon changes no data dir, so features and the CTC model do not rerun.
STAGE = Stage("prepare", run, reads=(), config=("corpus", "sets"), check=check,
              ignored=("corpus.lexicon", "corpus.dict_dir", "corpus.oov"), files=user_files,
              doc="corpus -> Kaldi data dirs (wav.scp segments text utt2spk spk2utt; stm glm)")
