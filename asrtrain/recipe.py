"""Recipes: config composition (Hydra compose API) and where a recipe's stages read and write.

A recipe is ``recipes/<name>/recipe.yaml``: its ``defaults`` pick groups from ``conf/`` and its body
sets corpus paths and the list of stages. Which stages run, and why, is ``asrtrain.pipeline``'s
business; what each stage does is in ``asrtrain/stages/<stage>.py``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from asrtrain import REPO_ROOT, AsrtrainError
from asrtrain.sections import DatadirCorpus, corpus_settings, sets_settings

CONF_DIR = REPO_ROOT / "conf"


def _unknown_key(error: str, recipe_dir: Path, overrides: Sequence[str]) -> str | None:
    """For an override of a key the config does not have (Hydra: ``Could not override``), the
    line settings.read says for an unknown key: ``features.bogus: unknown setting; known: ...``
    (the keys of its section in the config composed without it). None for any other error."""
    import re

    m = re.search(r"Could not override '([^']+)'", error)
    if not m or "." not in m.group(1):
        return None
    key = m.group(1)
    rest = [o for o in overrides if not o.lstrip("~").startswith(f"{key}=")]
    if len(rest) == len(overrides):
        return None
    section = OmegaConf.select(compose_recipe(recipe_dir, rest), key.rpartition(".")[0])
    if not isinstance(section, DictConfig):
        return None
    return (f"{key}: unknown setting; known: {', '.join(sorted(str(k) for k in section))} "
            f"(+{key}=... adds a key to the config)")


#: Hydra's composition of a recipe with only its config-group overrides, by recipe dir and those
#: overrides: (the YAML files' signature then, the config). See :func:`_composed`.
_COMPOSED: dict[tuple[Path, tuple[str, ...]], tuple[tuple, DictConfig]] = {}
_KEPT_MAX = 32     # the oldest goes first
#: The Hydra releases whose two composition steps _composed relies on (checked by
#: tests/test_recipe.py); with another, every composition is Hydra's whole.
HYDRA_SPLIT_CHECKED = "1.3."


def _yaml_signature(recipe_dir: Path) -> tuple:
    """Every YAML file under the recipe dir and ``conf/`` (what a composition can read): its
    path, size and modification time. Walking them is ~2 ms; composing ~0.35 s."""
    out = []
    for root in (recipe_dir, CONF_DIR):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith((".yaml", ".yml")):
                    st = os.stat(os.path.join(dirpath, name))
                    out.append((dirpath, name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _composed(recipe_dir: Path, overrides: Sequence[str], hydra_compose) -> DictConfig:
    """``hydra_compose(overrides)``, reusing an earlier composition of this process where the
    overrides differ only in plain settings (~0.35 CPU-s a composition; a command composes
    once, but a test session, a benchmark's simulations or the tests' warm command server
    compose hundreds of times, mostly the same recipe with other values).

    Hydra composes in two steps: the defaults list (the config groups chosen: an override whose
    key is a group, ``features@hybrid.features=fbank40``), then every other override applied in
    order to the composed config (``ConfigLoaderImpl._apply_overrides_to_config``:
    ``key=value``, ``+key=``, ``++key=``, ``~key``). Here the first step is memoized, keyed by
    the recipe dir, the group overrides and the signature of every file composition can read;
    the second is Hydra's own function on a copy. Where the split is not certain (an override
    that does not parse, a key under ``hydra``, a sweep, two settings of which one is inside
    the other, whose order would matter) the whole list goes to Hydra as it is, as does any
    error, so that the errors are Hydra's own."""
    import copy

    import hydra
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not hydra.__version__.startswith(HYDRA_SPLIT_CHECKED):   # its internals are used here
        return hydra_compose(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 - Hydra says what is wrong with it
        return hydra_compose(overrides)
    groups, settings = [], []
    for o in parsed:
        key = o.key_or_group
        if o.is_sweep_override() or key.split(".")[0].split("/")[0] == "hydra":
            return hydra_compose(overrides)
        # Hydra's own test (repo.group_exists): a folder of that name; a package (@) is a group's
        is_group = o.package is not None or any((root / key).is_dir()
                                                for root in (recipe_dir, CONF_DIR))
        (groups if is_group and not isinstance(o.value(), dict) else settings).append(o)
    keys = [o.key_or_group for o in settings]
    if any(a == b or a.startswith(b + ".") for i, a in enumerate(keys)
           for j, b in enumerate(keys) if i != j):
        return hydra_compose(overrides)
    group_lines = tuple(o.input_line for o in groups)
    signature = _yaml_signature(recipe_dir)
    memo = _COMPOSED.get((recipe_dir, group_lines))
    if memo is None or memo[0] != signature:
        try:
            memo = (signature, hydra_compose(group_lines))
        except Exception:  # noqa: BLE001 - the error as Hydra gives it for the whole list
            return hydra_compose(overrides)
        while len(_COMPOSED) >= _KEPT_MAX:     # a long session of many recipe dirs
            del _COMPOSED[next(iter(_COMPOSED))]
        _COMPOSED[recipe_dir, group_lines] = memo
    cfg = copy.deepcopy(memo[1])
    try:
        ConfigLoaderImpl._apply_overrides_to_config(settings, cfg)
    except Exception:  # noqa: BLE001 - the error as Hydra gives it for the whole list
        return hydra_compose(overrides)
    return cfg


def compose_recipe(recipe: str | Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``recipe.yaml`` of the recipe directory with ``conf/`` groups and overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    recipe_dir = Path(recipe).resolve()
    if recipe_dir.is_file():
        recipe_dir = recipe_dir.parent
    if not (recipe_dir / "recipe.yaml").is_file():
        raise AsrtrainError(f"{recipe_dir}/recipe.yaml: no such recipe (try recipes/tiny)")
    check_yaml(recipe_dir / "recipe.yaml")

    def hydra_compose(overrides: Sequence[str]) -> DictConfig:
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(recipe_dir), version_base=None):
                return compose("recipe", overrides=[
                    f"hydra.searchpath=[file://{CONF_DIR}]", f"+repo_root={REPO_ROOT}",
                    f"+recipe_dir={recipe_dir}", *overrides])
        finally:
            GlobalHydra.instance().clear()

    try:
        cfg = _composed(recipe_dir, overrides, hydra_compose)
    except (HydraException, OmegaConfBaseException) as e:
        unknown = _unknown_key(str(e), recipe_dir, overrides)
        if unknown:
            raise AsrtrainError(unknown) from None
        raise AsrtrainError(f"{recipe_dir}/recipe.yaml: cannot compose the config: "
                            f"{' '.join(str(e).split())}") from e
    except yaml.YAMLError as e:    # a conf/ group file Hydra loads (recipe.yaml is checked above)
        raise AsrtrainError(yaml_error_line(e, f"{recipe_dir}/recipe.yaml's config")) from None
    try:
        # every interpolation resolves (a typo in one would fail deep inside a stage)
        OmegaConf.to_container(cfg, resolve=True)
        _check_required(cfg, recipe_dir / "recipe.yaml")
        resolve_recipe_settings(cfg)
    except OmegaConfBaseException as e:
        key = f"{e.full_key}: " if getattr(e, "full_key", None) else ""
        raise AsrtrainError(f"{recipe_dir}/recipe.yaml: {key}{str(e).splitlines()[0]}") from None
    return cfg


#: What every recipe must say, and an example of each.
REQUIRED = {"exp_dir": "exp_dir: exp/${recipe}", "stages": "stages: [prepare, lang, features]",
            "sets": "sets: {train: train, dev: dev, test: [test]}"}


def _check_required(cfg: DictConfig, recipe_file: Path) -> None:
    """The keys the pipeline reads first, present (an empty or partial recipe.yaml would fail
    on a missing attribute deep inside)."""
    missing = [k for k in REQUIRED if OmegaConf.select(cfg, k, default=None) in (None, "")]
    if missing:
        raise AsrtrainError(f"{recipe_file}: no {', '.join(missing)}; a recipe says where it "
                            "writes, what it runs and on which sets, e.g. "
                            + "; ".join(REQUIRED[k] for k in missing)
                            + " (see recipes/tiny/recipe.yaml)")


def check_yaml(path: Path) -> None:
    """Parse ``path`` as YAML, so that a syntax error is one line, ``file:line:col: what``,
    instead of the parser's traceback from inside Hydra."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise AsrtrainError(f"{path}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x})"
                            ) from None
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise AsrtrainError(yaml_error_line(e, str(path))) from None


def yaml_error_line(e: yaml.YAMLError, where: str) -> str:
    """One line for a YAML error: ``file:line:col: YAML syntax error: problem (context at
    line:col)``, lines and columns counted from 1 as editors do."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        return f"{where}: YAML syntax error: {' '.join(str(e).split())}"
    mark = e.problem_mark
    name = mark.name if mark.name and not mark.name.startswith("<") else where
    problem = f"{name}:{mark.line + 1}:{mark.column + 1}: YAML syntax error: {e.problem}"
    if e.context:
        ctx = e.context_mark
        at = f" at {ctx.line + 1}:{ctx.column + 1}" if ctx is not None else ""
        problem += f" ({e.context}{at})"
    return problem


#: The stages of each system a recipe's ``systems`` may name, in the order of the stage table
#: (``asrtrain.stages.STAGES``; a test keeps them in step).
STAGE_ORDER = ("prepare", "lang", "features", "train", "decode", "score", "lm", "mfcc", "align",
               "fmllr", "decode_gmm", "ivectors", "train_hybrid", "decode_hybrid")
SYSTEM_STAGES = {
    "ctc": ("prepare", "lang", "features", "train", "decode", "score"),
    "gmm": ("prepare", "lang", "lm", "mfcc", "align", "decode_gmm"),
    "hybrid": ("prepare", "lang", "features", "lm", "mfcc", "align", "fmllr", "decode_gmm",
               "train_hybrid", "decode_hybrid"),
}
#: Stages that need a pronunciation lexicon (words.txt with #0, L.fst).
LEXICON_STAGES = ("lm", "align", "fmllr", "decode_gmm", "train_hybrid", "decode_hybrid")
#: ``nj: auto`` takes the cores this process may use, at most this many: each job is a process
#: of its own (torch and an audio pipe), and a few keep the disk busy.
MAX_AUTO_NJ = 8


def resolve_recipe_settings(cfg: DictConfig) -> None:
    """Settings a recipe may leave to the machine or the corpus (recipes/datadir does):
    ``nj: auto`` (the cores), ``systems: auto`` (what the corpus allows) and ``stages: auto``
    (those the systems need); then a stage that needs a lexicon must have one."""
    if cfg.get("nj") == "auto":
        cfg.nj = default_nj()
    _normalize_sets(cfg)
    if cfg.get("corpus") is not None:
        corpus_settings(cfg)   # an unknown key or a wrong type: one line, before any stage
    if cfg.get("stages") == "auto" and "systems" not in cfg:
        raise AsrtrainError("stages: auto takes the stages from systems:, which this recipe "
                            "does not have; list the stages")
    if "systems" in cfg:
        cfg.systems = _systems(cfg)
        if cfg.get("stages") == "auto":
            cfg.stages = [s for s in STAGE_ORDER
                          if any(s in SYSTEM_STAGES[x] for x in cfg.systems)
                          or (s == "ivectors" and needs_ivectors(cfg))]
            # GMM passes are decoded only when the GMM system is asked for.
            if "gmm" not in cfg.systems and OmegaConf.select(cfg, "align.decode"):
                cfg.align.decode = False
    _check_lexicon(cfg)
    _check_split_stages(cfg)


def hybrid_input_appends(cfg: DictConfig) -> list[str]:
    """The streams the hybrid model's input appends: ``hybrid.features.append`` when the recipe
    gives the hybrid model features of its own, else ``features.append`` (absent: none)."""
    features = OmegaConf.select(cfg, "hybrid.features") or cfg.get("features") or {}
    return [str(s) for s in (features.get("append") or [])]


def _normalize_sets(cfg: DictConfig) -> None:
    """``sets`` checked (:class:`asrtrain.sections.Sets`); a single test set name
    (``sets.test=eval2000``) is written back as a list of one, as the user means it."""
    if cfg.get("sets") is None:
        return
    cfg.sets.test = list(sets_settings(cfg).test)


def needs_ivectors(cfg: DictConfig) -> bool:
    """Whether ``stages: auto`` runs the ``ivectors`` stage: the hybrid system is built and its
    input appends online i-vectors."""
    return "hybrid" in cfg.systems and "ivector" in hybrid_input_appends(cfg)


def default_nj() -> int:
    """The parallel jobs of ``nj: auto``: the CPU cores this process may run on, capped."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_AUTO_NJ))


def has_lexicon(cfg: DictConfig) -> bool:
    """Whether the corpus brings a pronunciation lexicon: the LDC and tiny corpora always do,
    your own data dirs when ``corpus.dict_dir`` or ``corpus.lexicon`` is given."""
    corpus = corpus_settings(cfg)
    return corpus.has_lexicon() if isinstance(corpus, DatadirCorpus) else True


def _systems(cfg: DictConfig) -> list[str]:
    value = cfg.systems
    if value == "auto":
        return ["ctc", "gmm", "hybrid"] if has_lexicon(cfg) else ["ctc"]
    systems = [value] if isinstance(value, str) else list(value)
    unknown = [s for s in systems if s not in SYSTEM_STAGES]
    if unknown or not systems:
        raise AsrtrainError(f"systems={systems}: expected auto or a list of "
                            f"{', '.join(SYSTEM_STAGES)} (e.g. systems=[ctc,hybrid])")
    return [str(s) for s in systems]


def _check_split_stages(cfg: DictConfig) -> None:
    """Stages that need what ``align`` made before it was cut at Kaldi's seams: the GMM passes'
    graphs, decoding and the test sets' transforms (``decode_gmm``: for ``align.decode`` and
    ``decode_hybrid``) and the train and dev sets' fMLLR features (``fmllr``: for a hybrid
    model that appends them). A stage list without them (an older recipe's) is refused in one
    line that gives the list to use, rather than skipping the decoding or decoding through a
    missing or stale graph."""
    if not OmegaConf.is_list(cfg.get("stages")):
        return
    stages = [str(s) for s in cfg.stages]
    fmllr = ("fmllr",) if "fmllr" in hybrid_input_appends(cfg) else ()
    needs = {"align": ("decode_gmm",) if OmegaConf.select(cfg, "align.decode") else (),
             "train_hybrid": fmllr, "decode_hybrid": ("decode_gmm", *fmllr)}
    why = {"align": "align.decode=true", "train_hybrid": "train_hybrid",
           "decode_hybrid": "decode_hybrid"}
    missing = [s for s in STAGE_ORDER
               if s in {m for r, ms in needs.items() if r in stages for m in ms} - set(stages)]
    if not missing:
        return
    readers = [why[r] for r, ms in needs.items() if r in stages and set(ms) & set(missing)]
    at = stages.index("align") + 1 if "align" in stages else len(stages)
    fixed = [*stages[:at], *missing, *stages[at:]]
    what = {"fmllr": "fmllr (the fMLLR features)",
            "decode_gmm": "decode_gmm (the GMM passes' graphs and decoding)"}
    one = len(missing) == 1
    raise AsrtrainError(
        f"stages: {' and '.join(readers)} need{'s' if len(readers) == 1 else ''} "
        f"{' and '.join(what[m] for m in missing)}, "
        f"{'a stage of its own' if one else 'stages of their own'} since align was split: "
        f"list {'it' if one else 'them'}: stages: [{', '.join(fixed)}]"
        + (" (or align.decode=false)" if readers == ["align.decode=true"] else ""))


def _check_lexicon(cfg: DictConfig) -> None:
    """The GMM and hybrid stages without a lexicon would fail deep inside (kaldilm: 'has no
    symbol for #0'): say what to give instead, before anything runs."""
    need = [s for s in LEXICON_STAGES if s in (cfg.get("stages") or ())]
    if need and not has_lexicon(cfg):
        raise AsrtrainError(
            f"stages {', '.join(need)} (the GMM and hybrid systems) need a pronunciation "
            "lexicon, and corpus.kind=datadir has none: give corpus.lexicon=FILE (lines 'WORD "
            "PHONE ...'), corpus.lexicon=cmudict (English) or corpus.dict_dir=DIR (a Kaldi dict "
            "dir), or keep to systems=[ctc]")


@dataclass(frozen=True)
class Paths:
    """Where a recipe's stages read and write, under ``exp_dir`` (docs/architecture.md shows the
    tree). Stages and tasks take their paths from here, never build them by hand."""

    exp: Path

    @property
    def data(self) -> Path:
        return self.exp / "data"

    def data_set(self, name: str) -> Path:
        """The Kaldi data dir of set ``name`` (with the fbank ``feats.scp``)."""
        return self.exp / "data" / name

    def mfcc_set(self, name: str) -> Path:
        """The copy of data set ``name`` that carries MFCCs for the GMMs (Kaldi: a second
        data dir)."""
        return self.exp / "data" / f"{name}_mfcc"

    def mfcc_subset(self, name: str, subset: str) -> Path:
        """The MFCC data dir of a subset of set ``name`` that a GMM pass trains on, named by its
        rules (``asrtrain.data.datadir.subset_slug``: ``first100000_maxdup200``, Kaldi's
        ``train_100k_nodup``); the set itself when ``subset`` is empty."""
        return self.mfcc_set(f"{name}_{subset}" if subset else name)

    def fmllr_set(self, name: str) -> Path:
        """The copy of data set ``name`` whose ``feats.scp`` holds speaker-adapted (fMLLR)
        features of the last SAT pass, for the hybrid model's input (no ``cmvn.scp``: they are
        speaker-normalized already)."""
        return self.exp / "data" / f"{name}_fmllr"

    def ivector_set(self, name: str) -> Path:
        """Online i-vectors of data set ``name``: ``ivector_online.{ark,scp}`` (one matrix per
        utterance, a row every ``ivector_period`` frames; frame ``t`` uses row
        ``t // period``) and ``ivector_period``."""
        return self.exp / "ivectors" / name

    @property
    def ivector_extractor(self) -> Path:
        """The diagonal UBM and i-vector extractor trained on the training set."""
        return self.exp / "ivectors" / "extractor"

    @property
    def dict_dir(self) -> Path:
        return self.exp / "data" / "local" / "dict"

    @property
    def lang(self) -> Path:
        return self.exp / "lang"

    @property
    def lm(self) -> Path:
        return self.exp / "lm"

    @property
    def feats(self) -> Path:
        """Feature arks of every set (fbank and MFCC)."""
        return self.exp / "feats"

    @property
    def align(self) -> Path:
        return self.exp / "align"

    def align_pass(self, name: str) -> Path:
        """GMM pass ``name``: model, tree, alignments of the training set, ``graph/``."""
        return self.exp / "align" / name

    @property
    def train(self) -> Path:
        return self.exp / "train"

    def model_dir(self, model: str) -> Path:
        """Checkpoints, ``final.pt`` and ``config.yaml`` of the model named ``model``."""
        return self.exp / "train" / model

    @property
    def decode(self) -> Path:
        return self.exp / "decode"

    def decode_dir(self, system: str, data_set: str) -> Path:
        """One layout for every system (a GMM pass, a CTC or hybrid model):
        ``ctm text decode.json score/``."""
        return self.exp / "decode" / system / data_set

    @property
    def logs(self) -> Path:
        return self.exp / "log"

    @property
    def markers(self) -> Path:
        return self.exp / ".done"


def data_sets(cfg: DictConfig) -> list[str]:
    """Every data set the recipe uses: train, dev, then the test sets."""
    return sets_settings(cfg).all()
