"""Stage ``score``: the CTC model's WER on each test set (Hub5 rules with an stm, else plain WER
of the transcripts)."""

from __future__ import annotations

from asrtrain.pipeline import Stage, StageContext


def run(ctx: StageContext) -> None:
    from asrtrain.score import report_wer, score_decode

    cfg, paths = ctx.cfg, ctx.paths
    system = str(cfg.model.name)
    for name in cfg.sets.test:
        dec = paths.decode_dir(system, name)
        counts = score_decode(paths.data_set(name), dec, kaldi_filter=bool(cfg.score.kaldi_filter),
                              backend=str(cfg.score.backend))
        report_wer(str(name), system, counts, dec / "score")


STAGE = Stage("score", run, reads=("decode", "prepare"), config=("score",),
              doc="WER for SWB, CallHome and all (Hub5 rules)")
