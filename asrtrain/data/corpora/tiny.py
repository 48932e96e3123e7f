"""The tiny corpus in ``data/tiny``: synthetic speech in the exact LDC layouts, for CI.

``data/tiny/make_tiny.py`` writes a dozen Switchboard-like conversations and six Hub5'00-like
test conversations (``sw_*`` and ``en_*``) as 2-channel 8 kHz mu-law SPHERE, with ms98-style
transcripts and lexicon, a pem, an stm and a GLM. It is prepared by the very Switchboard and
eval2000 preparers the real corpora use, only with smaller held-out counts.

Layout expected on disk::

    <root>/LDC97S62/swb1_d1/data/sw02001.sph ...
    <root>/LDC97S62/swb_ms98_transcriptions/sw-ms98-dict.text, 20/2001/sw2001A-ms98-a-trans.text
    <root>/LDC2002S09/hub5e_00/english/hub5e_00.pem, en_4156.sph ...
    <root>/LDC2002T43/reference/hub5e00.english.000405.stm, en20000405_hub5.glm
"""

from __future__ import annotations

import logging
from pathlib import Path

from asrtrain.data.corpora.eval2000 import Eval2000, prepare_eval2000
from asrtrain.data.corpora.ldc import require_dir
from asrtrain.data.corpora.swbd import SwbdCorpus, prepare_swbd

log = logging.getLogger(__name__)

LAYOUT = "the tiny corpus: <root>/LDC97S62, <root>/LDC2002S09, <root>/LDC2002T43"


def prepare_tiny(root: Path, dev_utts: int, max_dup: int,
                 expected_test_sides: int | None) -> tuple[SwbdCorpus, Eval2000]:
    """Prepare the tiny corpus at ``root`` (normally ``<repo>/data/tiny``) like SWB-300."""
    root = require_dir(Path(root), "tiny corpus", LAYOUT)
    # Its files look like LDC's, so say once what it is: WERs on it say nothing about SWB.
    log.warning("%s: the bundled tiny corpus is a small synthetic stand-in (espeak-ng speech, "
                "12 conversations in the LDC layouts), not the full Switchboard-1 LDC97S62 or "
                "Hub5'00; see %s/README.md", root, root)
    swbd = prepare_swbd(root / "LDC97S62", root / "LDC97S62", dev_utts=dev_utts,
                        max_dup=max_dup, max_missing_audio=0, expected_sph=None)
    test = prepare_eval2000(root / "LDC2002S09", root / "LDC2002T43",
                            expected_sides=expected_test_sides)
    return swbd, test
