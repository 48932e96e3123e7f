"""The two sections of a recipe that no one stage owns, read by :func:`asrtrain.settings.read`:

- ``sets``: the data sets the recipe trains on, tunes on and tests (:class:`Sets`);
- ``corpus``: where the corpus is and how it is prepared, one dataclass per ``corpus.kind``
  (:data:`CORPORA`), whose defaults are those of ``conf/corpus/<kind>.yaml`` (the tests compare
  them).

``corpus_settings(cfg)`` and ``sets_settings(cfg)`` are what every stage and the recipe checks use;
an unknown key or a value of the wrong type is refused in one line naming ``corpus.<key>`` before
any stage runs. A value the YAML leaves to the user (Hydra's ``???``) is None here, and is asked
for by name (:meth:`LdcCorpus.need`) only by the stage that reads it, so ``--dry-run`` and
``--show-config`` work without it. Base layer (docs/architecture.md, "Layers"): imports nothing of
the package but :mod:`asrtrain` and :mod:`asrtrain.settings`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asrtrain import AsrtrainError
from asrtrain.settings import bad, check, choice, integer, opt, optional, read, text

#: Hydra's and OmegaConf's mark of a value the user must give.
MISSING = "???"


def _plain(cfg: Any) -> Any:
    """A plain container of ``cfg`` (an omegaconf node resolved, ``???`` kept as it is)."""
    try:
        from omegaconf import OmegaConf
    except ImportError:   # hydra-core brings omegaconf; plain mappings work without it
        return cfg
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    return cfg


# ------------------------------------------------------------------------------------- sets
def _set_name(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise bad(key, value, f"one set name (e.g. {key}=train_nodup)")
    return str(value)


def _set_names(key: str, value: Any) -> tuple[str, ...]:
    """A list of set names; one name alone is a list of one, as the user means it."""
    if isinstance(value, str | int) and not isinstance(value, bool):
        return (str(value),)
    if isinstance(value, str | bytes | Mapping) or not hasattr(value, "__iter__"):
        raise bad(key, value, f"a list of set names (e.g. {key}=[eval2000] or {key}=eval2000)")
    names = list(value)
    if any(isinstance(v, bool) or not isinstance(v, str | int) for v in names):
        raise bad(key, names, f"a list of set names (e.g. {key}=[eval2000,rt03])")
    return tuple(str(v) for v in names)


@dataclass(frozen=True)
class Sets:
    """``sets``: ``train`` (the training set), ``dev`` (held-out loss, tuning), ``test`` (the
    sets decoded and scored). Every recipe names them."""

    train: str | None = opt(None, optional(_set_name))
    dev: str | None = opt(None, optional(_set_name))
    test: tuple[str, ...] = opt((), _set_names)

    def __post_init__(self) -> None:
        for key in ("train", "dev"):
            check(getattr(self, key) is not None,
                  f"sets.{key} is not set: give the name of a data set (e.g. sets.{key}=...)")

    def all(self) -> list[str]:
        """Every set the recipe uses: train, dev, then the test sets, each once."""
        return list(dict.fromkeys([self.train, self.dev, *self.test]))


def sets_settings(cfg: Any) -> Sets:
    """The recipe's ``sets`` section, checked (``cfg``: the composed config)."""
    return read(Sets, _plain(cfg.get("sets")), "sets")


# ----------------------------------------------------------------------------------- corpus
def _given(key: str, value: Any) -> str | None:
    """A path the user gives; None while the YAML's ``???`` stands."""
    if value is None or value == MISSING:
        return None
    return text(key, value)


def _paths(key: str, value: Any) -> tuple[str, ...] | None:
    """One directory or a list of them; None while ``???`` stands."""
    if value is None or value == MISSING:
        return None
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        raise bad(key, value, "a directory or a list of directories")
    return tuple(text(f"{key}[{i}]", v) for i, v in enumerate(value))


def _data_dirs(key: str, value: Any) -> dict[str, str] | None:
    """``set name: directory`` of your own Kaldi data dirs; None while ``???`` stands."""
    if value is None or value == MISSING:
        return None
    if not isinstance(value, Mapping):
        raise bad(key, value, "a mapping of set name to data dir, e.g. "
                              "{train: /d/train, dev: /d/dev, test: /d/test}")
    return {str(k): text(f"{key}.{k}", v) for k, v in value.items()}


def _one_of(expected: str, *names: str):
    """One of ``names``; refused saying ``expected`` (what each means)."""
    def parse(key: str, value: Any) -> str:
        if value not in names:
            raise bad(key, value, expected)
        return str(value)
    return parse


def _dev_percent(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 50:
        raise bad(key, value, "a share of the training speakers from 0 to 50")
    return float(value)


class _Corpus:
    """What every corpus kind has: its kind, and whether audio at another rate is resampled."""

    kind: str
    resample: bool

    def need(self, key: str, what: str) -> Any:
        """The value of ``corpus.<key>``, which the stage at hand cannot do without."""
        value = getattr(self, key)
        if value is None:
            raise AsrtrainError(f"corpus.{key} is not set: give {what} "
                                f"(e.g. a override corpus.{key}=...)")
        return value


@dataclass(frozen=True)
class TinyCorpus(_Corpus):
    """``kind: tiny`` (``conf/corpus/tiny.yaml``): data/tiny, the Switchboard and Hub5'00 LDC
    layouts with synthetic speech, prepared by the very code SWB-300 uses."""

    kind: str = opt("tiny", choice("tiny"))
    root: str | None = opt(None, _given)
    dev_utts: int = opt(40, integer(0))
    max_dup: int = opt(4, integer(1))
    expected_test_sides: int = opt(12, integer(1))
    resample: bool = False


@dataclass(frozen=True)
class Swb300Corpus(_Corpus):
    """``kind: swb300`` (``conf/corpus/swb300.yaml``): Switchboard-1 and Hub5'00 as Kaldi s5c."""

    kind: str = opt("swb300", choice("swb300"))
    swbd_audio: str | None = opt(None, _given)
    swbd_transcripts: str | None = opt(None, _given)
    eval2000_audio: str | None = opt(None, _given)
    eval2000_transcripts: str | None = opt(None, _given)
    dev_utts: int = opt(4000, integer(0))
    max_dup: int = opt(300, integer(1))
    max_missing_audio: int = opt(3, integer(0))
    expected_test_sides: int = opt(80, integer(1))
    resample: bool = False


@dataclass(frozen=True)
class Swb2000Corpus(Swb300Corpus):
    """``kind: swb2000`` (``conf/corpus/swb2000.yaml``): swb300's sets plus Fisher English in
    training, as Kaldi's fisher_swbd/s5."""

    kind: str = opt("swb2000", choice("swb2000"))
    fisher_dirs: tuple[str, ...] | None = opt(None, _paths)
    fisher_conversations: int = opt(11699, integer(0))


@dataclass(frozen=True)
class DatadirCorpus(_Corpus):
    """``kind: datadir`` (``conf/corpus/datadir.yaml``): your own Kaldi data dirs; the keys are
    described in that file and recipes/datadir/README.md."""

    kind: str = opt("datadir", choice("datadir"))
    sets: dict[str, str] | None = opt(None, _data_dirs)
    dev_percent: float = opt(10.0, _dev_percent)
    dev_split: str = opt("speaker", _one_of(
        "speaker (held-out speakers, Kaldi's subset_data_dir_tr_cv.sh) or utterance (held-out "
        "utterances of the training speakers)", "speaker", "utterance"))
    lexicon: str | None = opt(None, optional(text))
    dict_dir: str | None = opt(None, optional(text))
    oov: str = opt("unk", _one_of("unk (map to <unk>) or error", "unk", "error"))
    sample_rate: int = opt(8000, integer(1))
    resample: bool = True

    def __post_init__(self) -> None:
        check(not (self.lexicon and self.dict_dir),
              "corpus.lexicon and corpus.dict_dir are both given: give one")

    def has_lexicon(self) -> bool:
        return bool(self.lexicon or self.dict_dir)


#: ``corpus.kind`` -> its section's dataclass.
CORPORA: dict[str, type] = {"tiny": TinyCorpus, "swb300": Swb300Corpus,
                            "swb2000": Swb2000Corpus, "datadir": DatadirCorpus}
Corpus = TinyCorpus | Swb300Corpus | Swb2000Corpus | DatadirCorpus


def corpus_of(section: Mapping | Corpus) -> Corpus:
    """The ``corpus`` section (a mapping, an omegaconf node, or already read), checked."""
    if isinstance(section, tuple(CORPORA.values())):
        return section
    section = _plain(section)
    if not isinstance(section, Mapping):
        raise bad("corpus", section, "a mapping with kind: " + ", ".join(CORPORA))
    kind = section.get("kind")
    if kind not in CORPORA:
        raise AsrtrainError(f"corpus.kind is {kind!r}; expected one of {', '.join(CORPORA)}")
    return read(CORPORA[kind], section, "corpus")


def corpus_settings(cfg: Any) -> Corpus:
    """The recipe's ``corpus`` section, checked (``cfg``: the composed config)."""
    return corpus_of(cfg.get("corpus"))


def fields_of(kind: str) -> list[str]:
    """The keys of ``corpus.kind=<kind>`` (for tests and messages)."""
    return [f.name for f in dataclasses.fields(CORPORA[kind])]
