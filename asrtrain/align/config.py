"""The options of a GMM pass (``align.passes.<name>``), read by :func:`asrtrain.settings.read`:
:class:`GmmConfig` holds every default (Kaldi's ``train_mono.sh``, ``train_deltas.sh``,
``train_lda_mllt.sh``, ``train_sat.sh``), :data:`TRI_DEFAULTS` the triphone passes' own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from asrtrain.settings import choice, integer, opt, read

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
