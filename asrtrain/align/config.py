"""The ``align`` section, read by :func:`asrtrain.settings.read`: :class:`AlignConfig` (its own
keys: where the alignments come from, the passes in order), read by :func:`align_settings`, which
every stage that reads the section calls; and the options of a GMM pass
(``align.passes.<name>``): :class:`GmmConfig` holds every default (Kaldi's ``train_mono.sh``,
``train_deltas.sh``, ``train_lda_mllt.sh``, ``train_sat.sh``), :data:`TRI_DEFAULTS` the triphone
passes' own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asrtrain import AsrtrainError
from asrtrain.settings import bad, check, choice, integer, mapping, opt, optional, read, text

PASS_TYPES = ("deltas", "lda_mllt", "sat")


@dataclass(frozen=True)
class GmmConfig:
    """Options of a GMM pass; names and defaults as Kaldi's train_mono.sh / train_deltas.sh /
    train_lda_mllt.sh / train_sat.sh (``type`` picks the script; the first pass is mono). Read by
    :func:`asrtrain.settings.read` (:meth:`from_config`)."""

    num_iters: int = 40
    totgauss: int = 1000                 # mono: target total Gaussians
    num_leaves: int = 2000               # tri: tree leaves (pdfs)
    num_gauss: int = 10000               # tri: target total Gaussians
    max_iter_inc: int = 30               # mix up during the first iterations only
    realign_iters: tuple[int, ...] = (
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 18, 20, 23, 26, 29, 32, 35, 38)
    delta_order: int = 2
    acoustic_scale: float = 0.1
    self_loop_scale: float = 0.1
    transition_scale: float = 1.0
    min_gaussian_occupancy: float = 10.0
    var_floor_factor: float = 0.01       # variance floor = factor * global variance
    tree_thresh: float = 0.0             # minimum likelihood gain of a split
    tree_min_count: float = 10.0         # frames on each side of a split
    max_fail_fraction: float = 0.1
    num_utts: int = 0                    # train on the shortest N utterances (0: all), as
    #                                      Kaldi's mono on subset_data_dir.sh --shortest
    batch_frames: int = 20000
    max_batch_mb: float = 256.0          # likelihood work tensors of one block of frames
    device: str = "cpu"                  # cpu | cuda[:N]: where likelihoods and Viterbi run
    nj: int = 1                          # parallel alignment jobs on the CPU (the pipeline's nj)
    graph_cache_mb: float = 4096.0       # training graphs kept for the pass's realignments
    part_batch_frames: int = 200000      # frames (whole speakers) a job holds at once: its
    #                                      memory, not its results (passjobs.Part.batches)
    type: str = opt("deltas", choice(*PASS_TYPES))  # deltas | lda_mllt (tri3) | sat (tri4)
    left_context: int = opt(3, integer(0))   # lda_mllt: splice-feats --left-context
    right_context: int = opt(3, integer(0))  # lda_mllt: splice-feats --right-context
    dim: int = opt(40, integer(1))           # lda_mllt: est-lda --dim
    mllt_iters: tuple[int, ...] = (2, 4, 6, 12)
    fmllr_iters: tuple[int, ...] = (2, 4, 6, 12)
    silence_weight: float = 0.0          # weight-silence-post for LDA, MLLT and fMLLR stats
    fmllr_min_count: float = 500.0       # gmm-est-fmllr --fmllr-min-count: fewer -> identity
    fmllr_num_iters: int = 40            # gmm-est-fmllr --fmllr-num-iters (row sweeps)

    @classmethod
    def from_config(cls, cfg: Mapping | None, section: str = "GMM pass",
                    **defaults) -> GmmConfig:
        """The options of ``cfg`` over ``defaults`` (a pass type's, e.g. :data:`TRI_DEFAULTS`),
        read by :func:`asrtrain.settings.read`; errors name ``<section>.<key>``
        (``align.passes.tri2.num_leaves``)."""
        return read(cls, {**defaults, **dict(cfg or {})}, section)


TRI_DEFAULTS = dict(num_iters=35, realign_iters=(10, 20, 30), max_iter_inc=25)


#: A pass's keys that are not :class:`GmmConfig`'s: the pass it starts from and the subset of
#: ``sets.train`` it trains on (:func:`asrtrain.data.datadir.check_subset_rules`).
PASS_KEYS = ("from", "data")


def pass_type(opts: Mapping) -> str:
    """A pass's ``type`` (``deltas`` when not given)."""
    return opts.get("type") or "deltas"


def _passes(key: str, value: Any) -> dict[str, dict]:
    """``align.passes``: pass name -> its options, in the order given. Each pass's ``from`` is
    None or a name and its ``data`` subset rules are checked here; its other options by
    :meth:`GmmConfig.from_config` (types, ranges, unknown keys). The options are kept as given
    (not filled with defaults): the stages key their inner steps by them."""
    from asrtrain.data.datadir import check_subset_rules

    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise bad(key, value, "a mapping of pass name -> options (e.g. mono: {from: null})")
    out: dict[str, dict] = {}
    for name, opts in value.items():
        where = f"{key}.{name}"
        if not isinstance(opts, Mapping):
            raise bad(where, opts, "a mapping of the pass's options (e.g. {from: mono})")
        opts = dict(opts)
        optional(text)(f"{where}.from", opts.get("from"))
        check_subset_rules(opts.get("data"), f"{where}.data")
        GmmConfig.from_config({k: v for k, v in opts.items() if k not in PASS_KEYS}, where)
        out[str(name)] = opts
    return out


def _options(key: str, value: Any) -> dict:
    """A mapping of options checked where they are used (None: none)."""
    return mapping(key, value) or {}


@dataclass(frozen=True)
class AlignConfig:
    """``align``: the GMM passes (``source: train``) or Kaldi's alignments (``source: kaldi``).
    Read by :func:`align_settings`; the defaults are conf/align/tiny.yaml's (the tests compare
    them), but for ``passes``, which each recipe gives."""

    source: str = opt("train", choice("train", "kaldi"))  # train | kaldi (import ali-to-pdf)
    kaldi_dir: str | None = opt(None, optional(text))      # source=kaldi: the ali-to-pdf dir
    num_pdfs: int | None = opt(None, optional(integer(1)))  # source=kaldi: else kaldi_dir's
    kaldi_fmllr: dict | None = None      # a Kaldi experiment's final.mat, splice_opts, trans.*
    #                                      (checked by asrtrain.decode.fmllr.check_kaldi_fmllr)
    decode: bool = True                  # decode the test sets with every pass and score
    # the passes' decoding (decode.sh's --beam and --max-active, the acoustic scales tried,
    # the device of the likelihoods): asrtrain.decode.GmmDecodeConfig's keys, checked by the
    # decode_gmm stage (a layer above); kept as given
    decode_options: dict = opt({}, _options)
    passes: dict = opt({}, _passes)      # pass name -> options (GmmConfig's, from, data)

    def __post_init__(self) -> None:
        """The passes in order: the first from nothing, every later one from an earlier pass; a
        SAT pass from an LDA+MLLT or SAT one (train_sat.sh adapts the ``final.mat`` features);
        the last on all of ``sets.train``."""
        names = list(self.passes)
        for i, (name, opts) in enumerate(self.passes.items()):
            src = opts.get("from")
            check((src is None) == (i == 0) and (src is None or src in names[:i]),
                  f"align.passes.{name}.from={src!r}: the first pass starts from nothing "
                  "(null), every later one from an earlier pass")
            if opts.get("data") and i == len(names) - 1:
                raise AsrtrainError(
                    f"align.passes.{name}.data: the last pass trains on all of sets.train: the "
                    "hybrid model and the fMLLR feature dirs take its alignments and "
                    "transforms; give the subset to an earlier pass (as s5c's tri1, tri2)")
            if pass_type(opts) == "sat" and src is not None and \
                    pass_type(self.passes[src]) not in ("lda_mllt", "sat"):
                raise AsrtrainError(
                    f"align.passes.{name}.type=sat: its from pass {src!r} is of type "
                    f"{pass_type(self.passes[src])!r}; SAT adapts LDA+MLLT features: start it "
                    "from an lda_mllt or sat pass")

    @property
    def last(self) -> str:
        """The last pass's name (the hybrid model's alignments and transforms)."""
        return list(self.passes)[-1]

    def last_is_sat(self) -> bool:
        """Whether the recipe trains its own passes and the last one is SAT (fMLLR)."""
        return (self.source == "train" and bool(self.passes)
                and pass_type(self.passes[self.last]) == "sat")


def align_settings(cfg: Any) -> AlignConfig:
    """The recipe's ``align`` section, checked (``cfg``: the composed config); an absent
    section is all defaults (no passes)."""
    from omegaconf import OmegaConf

    section = cfg.get("align")
    if OmegaConf.is_config(section):
        section = OmegaConf.to_container(section, resolve=True)
    return read(AlignConfig, section, "align")
