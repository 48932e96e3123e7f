"""The ``corpus`` and ``sets`` sections through the one config reader (asrtrain.sections): the
defaults of each corpus kind are those of conf/corpus/<kind>.yaml, unknown keys and wrong types
are one line naming ``corpus.<key>`` before any stage runs, a path left as ``???`` is asked for
by name only by the stage that needs it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import forked_cli
import pytest
from omegaconf import OmegaConf

from asrtrain import AsrtrainError
from asrtrain.data.corpora import prepare_corpus
from asrtrain.recipe import compose_recipe
from asrtrain.sections import (
    CORPORA,
    MISSING,
    DatadirCorpus,
    Sets,
    Swb2000Corpus,
    corpus_of,
    sets_settings,
)
from asrtrain.settings import defaults, read

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", sorted(CORPORA))
def test_each_kinds_yaml_lists_the_dataclass_defaults(kind: str) -> None:
    yaml = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "corpus" / f"{kind}.yaml"),
                                  resolve=False)
    cls = CORPORA[kind]
    fields = {f.name for f in dataclasses.fields(cls)}
    # resample: the LDC and tiny corpora are 8 kHz SPHERE; a recipe adds +corpus.resample=true
    not_listed = set() if kind == "datadir" else {"resample"}
    assert set(yaml) == fields - not_listed, (sorted(set(yaml) - fields),
                                              sorted(fields - set(yaml)))
    want = defaults(cls)
    for key, value in yaml.items():
        if isinstance(value, str) and value.startswith("${"):
            continue    # an interpolation (corpus.root, datadir's sample_rate): the recipe's
        assert (None if value == MISSING else value) == want[key], key
    # the YAML as composed reads to the dataclass's own defaults (paths aside)
    read_back = corpus_of({k: v for k, v in yaml.items() if not str(v).startswith("${")})
    assert read_back == cls(**{k: getattr(read_back, k) for k in ("root", "sample_rate")
                               if k in fields})


def test_every_recipe_composes_to_a_checked_corpus_and_sets() -> None:
    for recipe in sorted((REPO / "recipes").glob("*/recipe.yaml")):
        cfg = compose_recipe(recipe.parent)
        kind = cfg.corpus.kind
        assert isinstance(corpus_of(cfg.corpus), CORPORA[kind])
        sets = sets_settings(cfg)
        assert sets.train and sets.dev and sets.test, recipe


@pytest.mark.parametrize(("section", "message"), [
    ({"kind": "tiny", "bogus": 1}, "corpus.bogus: unknown setting; known: dev_utts, "
                                   "expected_test_sides, kind, max_dup, resample, root"),
    ({"kind": "tiny", "dev_utts": "forty"}, "corpus.dev_utts='forty': expected an integer >= 0"),
    ({"kind": "swb300", "max_dup": 0}, "corpus.max_dup=0: expected an integer >= 1"),
    ({"kind": "swb2000", "fisher_dirs": {"a": 1}},
     "corpus.fisher_dirs={'a': 1}: expected a directory or a list of directories"),
    ({"kind": "swb300", "fisher_dirs": ["/x"]}, "corpus.fisher_dirs: unknown setting"),
    ({"kind": "datadir", "sets": ["/d/train"]},
     r"corpus.sets=\['/d/train'\]: expected a mapping of set name to data dir"),
    ({"kind": "datadir", "resample": "yes"}, "corpus.resample='yes': expected true or false"),
    ({"kind": "datadir", "lexicon": "cmudict", "dict_dir": "/d"}, "both given: give one"),
    ({"kind": "wsj"}, "corpus.kind is 'wsj'; expected one of tiny, swb300, swb2000, datadir"),
])
def test_bad_corpus_settings_are_one_line_naming_the_key(section: dict, message: str) -> None:
    with pytest.raises(AsrtrainError, match=message) as e:
        corpus_of(section)
    assert "\n" not in str(e.value)


def test_a_path_left_to_the_user_is_asked_for_by_the_stage_that_reads_it(tmp_path) -> None:
    c = corpus_of({"kind": "swb2000", "swbd_audio": MISSING, "fisher_dirs": "/f"})
    assert isinstance(c, Swb2000Corpus) and c.swbd_audio is None and c.fisher_dirs == ("/f",)
    with pytest.raises(AsrtrainError, match=r"corpus.swbd_audio is not set: give the LDC97S62 "
                                            r"directory \(e.g. a override corpus.swbd_audio="):
        prepare_corpus(c, tmp_path / "data")
    assert not (tmp_path / "data").exists()
    assert isinstance(corpus_of({"kind": "datadir"}), DatadirCorpus)


def test_sets_one_test_name_is_a_list_and_train_and_dev_are_needed() -> None:
    assert read(Sets, {"train": "a", "dev": "b", "test": "c"}, "sets").test == ("c",)
    assert read(Sets, {"train": "a", "dev": "b", "test": ["c", 7]}, "sets").all() == [
        "a", "b", "c", "7"]
    with pytest.raises(AsrtrainError, match="sets.dev is not set"):
        read(Sets, {"train": "a", "test": ["c"]}, "sets")
    with pytest.raises(AsrtrainError, match=r"sets.test=\[\['x'\]\]: expected a list of set"):
        read(Sets, {"train": "a", "dev": "b", "test": [["x"]]}, "sets")
    cfg = compose_recipe(REPO / "recipes" / "tiny", ["sets.test=eval2000"])
    assert list(cfg.sets.test) == ["eval2000"]


def test_an_unknown_corpus_key_stops_the_cli_before_any_stage(tmp_path: Path) -> None:
    proc = forked_cli.run("run", "recipes/tiny", f"exp_dir={tmp_path / 'exp'}",
                          "+corpus.dev_uts=3", "--dry-run", timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "corpus.dev_uts: unknown setting; known: dev_utts," in lines[0], \
        proc.stderr
    assert not (tmp_path / "exp").exists()
