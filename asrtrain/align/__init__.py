"""GMM-HMM training and alignment with Kaldi's semantics, in torch (batched, CPU or GPU).

Stages (each reads a data dir with MFCC ``feats.scp``/``cmvn.scp`` and a lang dir)::

    train_mono(data_dir, lang_dir, out_dir, cfg)             steps/train_mono.sh
    align_data(data_dir, lang_dir, model_dir, out_dir, cfg)  steps/align_si.sh
    train_tri(data_dir, lang_dir, ali_dir, out_dir, cfg)     steps/train_deltas.sh (tri1, tri2)
    import_kaldi_alignment(kaldi_dir, out_dir, num_pdfs)     align.source=kaldi

``cfg`` keys are the fields of :class:`asrtrain.align.train.GmmConfig`.  Every output dir holds
``final.mdl``, ``tree.txt``, ``num_pdfs``, ``ali.{ark,scp}`` (int32 pdf ids per frame),
``ali_phone_state.{ark,scp}``, ``log.txt`` and ``passes.json``.  Alignment scores only the pdfs
of each utterance's training graph, compiles each graph once per pass and runs in ``nj`` jobs
(:func:`asrtrain.align.model.align`); :func:`asrtrain.align.bench.time_align_iteration` times one
iteration at Switchboard model sizes.
"""

from asrtrain.align.train import (
    GmmConfig,
    align_data,
    import_kaldi_alignment,
    train_mono,
    train_tri,
)

__all__ = ["GmmConfig", "align_data", "import_kaldi_alignment", "train_mono", "train_tri"]
