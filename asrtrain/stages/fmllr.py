"""Stage ``fmllr``: the speaker-adapted (fMLLR) feature dirs ``paths.fmllr_set(set)`` of the
train and dev sets, the hybrid model's ``append: [fmllr]`` input (Kaldi's
``steps/nnet/make_fmllr_feats.sh`` with ``--transform-dir exp/tri4`` and ``exp/tri4_ali_dev``).

They come from the last GMM pass when it is SAT (its training transforms for train, those of its
alignment of the dev set for dev), or from a Kaldi experiment's ``final.mat`` and ``trans.*``
(``align.kaldi_fmllr``, read by content); without either the stage writes nothing. The test sets'
fMLLR dirs need their transforms from decoding, so ``decode_gmm`` writes them (with
:func:`write_fmllr_sets`), and an ``lm.*`` change never reaches the hybrid model's training.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from asrtrain.align.config import align_settings
from asrtrain.pipeline import Stage, StageContext
from asrtrain.sections import sets_settings
from asrtrain.stages.align import (
    final_alignments,
    fmllr_options,
    fmllr_sets,
    kaldi_fmllr_files,
    step,
)

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    sets = sets_settings(ctx.cfg)
    write_fmllr_sets(ctx, [sets.train, sets.dev])


def write_fmllr_sets(ctx: StageContext, sets: list[str]) -> None:
    """One inner step per set of ``sets`` that gets fMLLR features (``fmllr_sets``): from Kaldi's
    matrices when ``align.kaldi_fmllr`` is given, else from the last (SAT) pass's transforms;
    keyed by the stage's inputs, Kaldi's files, and for a test set how its transforms were made
    (decoded or not, the scale chosen where)."""
    from asrtrain.decode import tuning_set

    cfg, paths = ctx.cfg, ctx.paths
    kaldi = _kaldi(cfg)
    decode = align_settings(cfg).decode
    how = [decode, tuning_set(cfg) if decode else None, align_settings(cfg).decode_options]
    read = sorted((str(p), ctx.files.get(str(p))) for p in kaldi_fmllr_files(cfg))
    recipe_sets = sets_settings(cfg)
    training = (recipe_sets.train, recipe_sets.dev)
    for set_name in fmllr_sets(cfg):
        if set_name not in sets:
            continue
        out = paths.fmllr_set(set_name)
        key = ctx.step_key("fmllr", set_name, kaldi, None if set_name in training else how,
                           read)
        step(ctx, out / ".done", key, out.name,
             lambda s=set_name, out=out: _write_fmllr_set(ctx, s, out, kaldi))


def _kaldi(cfg: DictConfig) -> dict | None:
    return align_settings(cfg).kaldi_fmllr or None


def _write_fmllr_set(ctx: StageContext, set_name: str, out: Path, kaldi: dict | None) -> None:
    from asrtrain.decode.fmllr import (
        import_kaldi_fmllr,
        read_transforms,
        undecoded_transforms,
        write_fmllr_set,
    )

    cfg, paths = ctx.cfg, ctx.paths
    data = paths.mfcc_set(set_name)
    if kaldi is not None:
        import_kaldi_fmllr(data, out, kaldi, set_name)
        return
    align = align_settings(cfg)
    last = align.last
    model_dir = paths.align_pass(last)
    sets = sets_settings(cfg)
    if set_name == sets.train:
        trans = read_transforms(model_dir)
    elif set_name == sets.dev:
        trans = read_transforms(Path(final_alignments(cfg, paths)["dev"]))
    elif align.decode:
        trans = read_transforms(paths.decode_dir(last, set_name))
    else:   # no decoding: the first pass and the estimation only, to get the transforms
        trans = undecoded_transforms(model_dir, model_dir / "graph", data, paths.lang,
                                     paths.lm, fmllr_options(align.passes[last]),
                                     nj=ctx.jobs(), cfg=align.decode_options)
    write_fmllr_set(model_dir, data, out, trans)


def check_kaldi_fmllr(cfg: DictConfig) -> None:
    """``align.kaldi_fmllr``'s shape, when given (no file is read)."""
    if _kaldi(cfg):
        from asrtrain.decode.fmllr import check_kaldi_fmllr as check_shape

        check_shape(_kaldi(cfg), fmllr_sets(cfg))


def _config(cfg: DictConfig) -> dict:
    """``align.kaldi_fmllr`` (when the feature dirs come from Kaldi's matrices)."""
    return {"align.kaldi_fmllr": _kaldi(cfg)} if fmllr_sets(cfg) and _kaldi(cfg) else {}


STAGE = Stage("fmllr", run, reads=("align",), config=_config, files=kaldi_fmllr_files,
              check=check_kaldi_fmllr,
              doc="fMLLR feature dirs of the train and dev sets (the last pass's SAT transforms "
                  "or Kaldi's)")
