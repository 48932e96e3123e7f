"""Stage ``decode``: the CTC model's greedy decoding of the test sets to ``text`` and ``ctm``."""

from __future__ import annotations

from asrtrain.pipeline import Stage, StageContext


def run(ctx: StageContext) -> None:
    from asrtrain.decode.ctc import decode_data_dir

    cfg, paths = ctx.cfg, ctx.paths
    system = str(cfg.model.name)
    for name in cfg.sets.test:
        decode_data_dir(paths.model_dir(system) / "final.pt", paths.lang / "units.model",
                        paths.data_set(name), paths.decode_dir(system, name),
                        batch_frames=int(cfg.decode.batch_frames))


STAGE = Stage("decode", run, reads=("train", "lang:units", "features"), config=("decode",),
              doc="decoding of the test sets to CTM")
