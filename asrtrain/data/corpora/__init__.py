"""Corpus preparation: from a corpus on disk to Kaldi data dirs and a Kaldi dict dir.

``prepare_corpus(corpus_cfg, data_root)`` dispatches on ``corpus_cfg["kind"]``:

=========  ==========================================================  ===========================
kind       corpora                                                     sets written
=========  ==========================================================  ===========================
tiny       data/tiny (LDC layouts, synthetic speech)                   train train_dev train_nodup
                                                                       eval2000
swb300     LDC97S62 + ms98 transcripts; LDC2002S09 + LDC2002T43        train train_dev train_nodup
                                                                       eval2000
swb2000    swb300's + Fisher (LDC2004S13 LDC2005S13 LDC2004T19         train train_dev train_nodup
           LDC2005T19) in train and train_nodup                        eval2000
datadir    the user's own Kaldi data dirs                              the user's set names
=========  ==========================================================  ===========================

plus ``data_root/local/dict`` (lexicon.txt, silence_phones.txt, nonsilence_phones.txt,
optional_silence.txt, extra_questions.txt; for datadir only when a dict dir is given). The test
set eval2000 also gets ``stm`` and ``glm``. Everything is read and checked before anything is
written, and each directory is built under a temporary name and swapped in, so a failed run
leaves the earlier outputs intact.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.data.corpora.datadir import prepare_datadir
from asrtrain.data.corpora.eval2000 import prepare_eval2000
from asrtrain.data.corpora.fisher import prepare_fisher
from asrtrain.data.corpora.swbd import SwbdCorpus, prepare_swbd, remove_dup_utts
from asrtrain.data.corpora.tiny import prepare_tiny
from asrtrain.data.datadir import DataDir
from asrtrain.fileio import atomic_dir
from asrtrain.sections import CORPORA, Corpus, DatadirCorpus, Swb2000Corpus, TinyCorpus, corpus_of

__all__ = ["KINDS", "prepare_corpus"]

KINDS = tuple(CORPORA)


def _combine(*parts: DataDir) -> DataDir:
    """Kaldi's utils/combine_data.sh for data dirs with disjoint ids."""
    out = DataDir()
    for part in parts:
        for name in ("wav", "text", "utt2spk", "segments", "reco2file_and_channel"):
            table, new = getattr(out, name), getattr(part, name)
            clash = table.keys() & new.keys()
            if clash:
                raise AsrtrainError(f"combining corpora: {name} id {min(clash)} occurs in both")
            table.update(new)
    return out


def _write(data_root: Path, sets: dict[str, DataDir], extra: dict[str, dict[str, bytes]],
           dict_files: dict[str, str | bytes] | None) -> list[str]:
    for name, data in sets.items():
        with atomic_dir(data_root / name) as tmp:
            data.write(tmp)
            for fname, content in extra.get(name, {}).items():
                (tmp / fname).write_bytes(content)
    if dict_files is not None:
        with atomic_dir(data_root / "local" / "dict") as tmp:
            for fname, content in dict_files.items():
                if isinstance(content, str):
                    content = content.encode("utf-8")
                (tmp / fname).write_bytes(content)
    return list(sets)


def _swbd_sets(swbd: SwbdCorpus) -> dict[str, DataDir]:
    return {name: swbd.sets[name] for name in ("train", "train_dev", "train_nodup")}


def prepare_corpus(corpus_cfg: Mapping | Corpus, data_root: Path) -> list[str]:
    """Prepare the corpus described by ``corpus_cfg`` under ``data_root``; return the set names.

    Keys per kind are those of ``conf/corpus/<kind>.yaml`` (:mod:`asrtrain.sections`).
    """
    cfg = corpus_of(corpus_cfg)
    data_root = Path(data_root)
    if isinstance(cfg, DatadirCorpus):
        user = prepare_datadir(cfg.need("sets", "the data dirs as set: <dir>"),
                               sample_rate=cfg.sample_rate, resample=cfg.resample,
                               dict_dir=cfg.dict_dir)
        return _write(data_root, user.sets, user.scoring, user.dict_files)

    if isinstance(cfg, TinyCorpus):
        swbd, test = prepare_tiny(cfg.need("root", "the tiny corpus directory (data/tiny)"),
                                  dev_utts=cfg.dev_utts, max_dup=cfg.max_dup,
                                  expected_test_sides=cfg.expected_test_sides)
    else:
        swbd = prepare_swbd(cfg.need("swbd_audio", "the LDC97S62 directory"),
                            cfg.need("swbd_transcripts", "the swb_ms98_transcriptions directory"),
                            dev_utts=cfg.dev_utts, max_dup=cfg.max_dup,
                            max_missing_audio=cfg.max_missing_audio)
        test = prepare_eval2000(cfg.need("eval2000_audio", "the LDC2002S09 directory"),
                                cfg.need("eval2000_transcripts", "the LDC2002T43 directory"),
                                expected_sides=cfg.expected_test_sides)
    sets = _swbd_sets(swbd)
    if isinstance(cfg, Swb2000Corpus):
        fisher_dirs = cfg.need("fisher_dirs", "the Fisher directories (LDC2004T19 LDC2005T19 "
                               "LDC2004S13 LDC2005S13)")
        fisher = prepare_fisher(list(fisher_dirs),
                                expected_conversations=cfg.fisher_conversations)
        nodev = swbd.sets["train"].subset(set(swbd.sets["train"].utts)
                                          - set(swbd.sets["train_dev"].utts))
        sets["train"] = _combine(swbd.sets["train"], fisher)
        sets["train_nodup"] = remove_dup_utts(_combine(nodev, fisher), cfg.max_dup)
    sets["eval2000"] = test.data
    return _write(data_root, sets, {"eval2000": {"stm": test.stm, "glm": test.glm}},
                  swbd.dict_dir.files())
