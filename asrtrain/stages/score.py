"""Stage ``score``: the CTC model's WER on each test set (Hub5 rules with an stm, else plain WER
of the transcripts), its ``result.json`` and the experiment's ``RESULTS.md``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf import DictConfig

from asrtrain.pipeline import Stage, StageContext
from asrtrain.sections import sets_settings
from asrtrain.settings import choice, opt, read

log = logging.getLogger("asrtrain")


def run(ctx: StageContext) -> None:
    from asrtrain.report import record_result, write_results
    from asrtrain.score import describe_scoring, report_wer, score_decode

    cfg, paths = ctx.cfg, ctx.paths
    system = str(cfg.model.name)
    for name in sets_settings(cfg).test:
        data, dec = paths.data_set(name), paths.decode_dir(system, name)
        log.info("score %s %s: %s", system, name, describe_scoring(data))
        counts = score_decode(data, dec, kaldi_filter=bool(cfg.score.kaldi_filter),
                              backend=str(cfg.score.backend))
        report_wer(str(name), system, counts, dec / "score")
        record_result(ctx, dec, system, "CTC", str(name), counts, data,
                      {"decoder": str(cfg.decode.kind)}, None)
    write_results(paths.exp)


@dataclass(frozen=True)
class ScoreConfig:
    """The ``score`` section (``conf/score/hub5.yaml``), read by :func:`asrtrain.settings.read`:
    ``backend`` python | sclite, ``kaldi_filter``, ``tune_on`` auto | test | dev."""

    backend: str = opt("python", choice("python", "sclite"))
    kaldi_filter: bool = True
    tune_on: str = opt("auto", choice("auto", "test", "dev"))


def check(cfg: DictConfig) -> None:
    from asrtrain.decode import tuning_set

    read(ScoreConfig, cfg.get("score"), "score")
    tuning_set(cfg)


# score.tune_on says where the graph decoders choose their settings: nothing for this stage.
STAGE = Stage("score", run, reads=("decode", "prepare"), config=("score",),
              ignored=("score.tune_on",), check=check,
              doc="WER of the test sets (Hub5 rules where a set has an stm, else plain WER)")
