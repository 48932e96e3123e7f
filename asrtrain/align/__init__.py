"""GMM-HMM training and alignment with Kaldi's semantics, in torch (batched, CPU or GPU).

Stages (each reads a data dir with MFCC ``feats.scp``/``cmvn.scp`` and a lang dir)::

    train_mono(data_dir, lang_dir, out_dir, cfg)             steps/train_mono.sh
    align_data(data_dir, lang_dir, model_dir, out_dir, cfg)  steps/align_si.sh (align_fmllr.sh
                                                             for a SAT model)
    train_tri(data_dir, lang_dir, ali_dir, out_dir, cfg)     steps/train_deltas.sh (tri1, tri2)
    train_lda_mllt(data_dir, lang_dir, ali_dir, out_dir, cfg)  steps/train_lda_mllt.sh (tri3)
    train_sat(data_dir, lang_dir, ali_dir, out_dir, cfg)     steps/train_sat.sh (tri4)
    align_fmllr(data_dir, lang_dir, model_dir, out_dir, cfg) steps/align_fmllr.sh
    train_pass(data_dir, lang_dir, ali_dir, out_dir, cfg)    one of the above by cfg ``type``
    import_kaldi_alignment(kaldi_dir, out_dir, num_pdfs)     align.source=kaldi

``cfg`` keys are the fields of :class:`asrtrain.align.config.GmmConfig`.  Every output dir holds
``final.mdl``, ``tree.txt``, ``num_pdfs``, ``ali.{ark,scp}`` (int32 pdf ids per frame),
``ali_phone_state.{ark,scp}``, ``log.txt`` and ``passes.json``; SAT passes and fMLLR alignments
add ``trans.{ark,scp}`` (a ``[dim, dim+1]`` fMLLR matrix per speaker) and ``final.alimdl``.  A
model's features come from :func:`asrtrain.align.model.model_features` (Δ, or splice + LDA+MLLT)
and :func:`asrtrain.align.model.load_data` (plus fMLLR transforms);
the passes share :mod:`asrtrain.align.passes`;
:func:`asrtrain.align.frames.estimate_transforms` estimates transforms from an alignment.
Alignment scores only the pdfs of each utterance's training graph and compiles each graph once per
pass; every statistics pass of a training pass (alignment, GMM, tree, LDA, MLLT, fMLLR,
``final.alimdl``) runs in jobs, one a block of whole speakers of the data dir (``split<N>/<k>``,
cut without ``nj``: ``nj`` processes serve them), that read their block from disk and return
statistics, summed in block order (:mod:`asrtrain.align.passjobs`,
:func:`asrtrain.jobs.run_jobs`): the same bytes whatever ``nj``;
:func:`asrtrain.align.bench.time_align_iteration` times one iteration at Switchboard model sizes.
"""

from __future__ import annotations

import importlib
from typing import Any

from asrtrain.align.config import GmmConfig

#: The torch modules' names, imported on first use (PEP 562): ``asrtrain.align.config``, which
#: the stages' checks and ``asrtrain run --help`` read, must not import torch with its package.
_LAZY = {"estimate_transforms": "asrtrain.align.frames",
         "align_fmllr": "asrtrain.align.sat", "train_sat": "asrtrain.align.sat",
         **{name: "asrtrain.align.train" for name in (
             "align_data", "import_kaldi_alignment", "train_lda_mllt", "train_mono",
             "train_pass", "train_tri")}}

__all__ = ["GmmConfig", "align_data", "align_fmllr", "estimate_transforms",
           "import_kaldi_alignment", "train_lda_mllt", "train_mono", "train_pass", "train_sat",
           "train_tri"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
