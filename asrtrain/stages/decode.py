"""Stage ``decode``: the CTC model's greedy decoding of the test sets to ``text`` and ``ctm``.

Which of the training run's models is decoded is ``decode.checkpoint`` (``best``, ``last``, or
the ``average`` of the ``decode.average_n`` epochs of lowest dev loss: asrtrain.models.average);
the log and each set's ``decode.json`` name it."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext
from asrtrain.sections import sets_settings

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.decode.ctc import decode_data_dir
    from asrtrain.models.average import CheckpointChoice, choose_model

    cfg, paths = ctx.cfg, ctx.paths
    system = str(cfg.model.name)
    model, chosen = choose_model(paths.model_dir(system), CheckpointChoice.from_config(
        cfg.decode, "decode"), paths.exp / "decode" / system)
    log.info("decode %s: the model decoded is the %s (decode.checkpoint=%s)", system,
             chosen["description"], chosen["checkpoint"])
    for name in sets_settings(cfg).test:
        decode_data_dir(model, paths.lang / "units.model", paths.data_set(name),
                        paths.decode_dir(system, name),
                        batch_frames=int(cfg.decode.batch_frames), checkpoint=chosen)


def check(cfg: DictConfig) -> None:
    from asrtrain.decode import CtcDecodeConfig
    from asrtrain.models.average import CheckpointChoice

    CtcDecodeConfig.from_config(cfg.get("decode"))
    CheckpointChoice.from_config(cfg.decode, "decode").check_kept(cfg.trainer, "decode",
                                                                  "trainer")


STAGE = Stage("decode", run, reads=("train", "lang:units", "features"), config=("decode",),
              check=check, doc="decoding of the test sets to CTM")
