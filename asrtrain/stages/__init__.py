"""The stage table: every stage a recipe may list, one module each (``asrtrain/stages/<name>.py``),
in the order of the tiny recipe. The Makefile has one target per entry (a test keeps them equal).
"""

from __future__ import annotations

from asrtrain.pipeline import Stage
from asrtrain.stages import (
                             align,
                             decode,
                             decode_gmm,
                             decode_hybrid,
                             features,
                             fmllr,
                             ivectors,
                             lang,
                             lm,
                             mfcc,
                             prepare,
                             score,
                             train,
                             train_hybrid,
)

STAGES: dict[str, Stage] = {m.STAGE.name: m.STAGE for m in (
    prepare, lang, features, train, decode, score, lm, mfcc, align, fmllr, decode_gmm, ivectors,
    train_hybrid, decode_hybrid)}
