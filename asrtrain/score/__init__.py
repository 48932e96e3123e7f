"""Hub5'00-style scoring whose counts equal NIST SCTK's hubscr.pl/sclite, in pure Python.

``score_hub5`` scores a CTM against an STM for the subsets all, swbd (files not starting ``en_``)
and callhm (files not starting ``sw_``), writing sclite-style reports; ``wer_counts`` scores plain
per-utterance transcripts.  The ``sclite`` backend runs SCTK itself for comparison.

Usage::

    counts = score_hub5(Path("stm"), Path("hyp.ctm"), Path("out"), glm=Path("glm"))
    print(counts["swbd"].wer)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.score.align import Counts, align_words, wer_counts
from asrtrain.score.hub5 import SUBSETS, SystemResult, in_subset, score_hub5_python

__all__ = ["Counts", "SUBSETS", "align_words", "report_name", "score_hub5", "wer_counts"]


def report_name(ctm: Path, subset: str) -> str:
    """Kaldi's report naming: ``<ctm>.filt`` for all, ``<ctm>.swbd.filt``, ``<ctm>.callhm.filt``."""
    name = Path(ctm).name
    return f"{name}.filt" if subset == "all" else f"{name}.{subset}.filt"


def score_hub5(stm: Path, ctm: Path, out_dir: Path, glm: Path | None = None,
               kaldi_filter: bool = True, backend: str = "python") -> dict[str, Counts]:
    """Score ``ctm`` against ``stm`` for all/swbd/callhm and write reports under ``out_dir``.

    ``kaldi_filter`` first removes what Kaldi's score_sclite.sh removes from the CTM (noise,
    <unk>, hesitations, partial words); without it the counts equal ``hubscr.pl`` on the same
    files.  ``backend`` is ``"python"`` or ``"sclite"`` (runs SCTK's hubscr.pl).  Reports are
    ``<out_dir>/<ctm name>[.swbd|.callhm].filt.{sys,raw,dtl}``.
    """
    from asrtrain.score.report import write_reports

    stm, ctm, out_dir = Path(stm), Path(ctm), Path(out_dir)
    for path, what in ((stm, "STM"), (ctm, "CTM")):
        if not path.is_file():
            raise AsrtrainError(f"{what} file {path} does not exist")
    if glm is not None and not Path(glm).is_file():
        raise AsrtrainError(f"GLM file {glm} does not exist")
    if backend == "python":
        results = score_hub5_python(stm, ctm, glm, kaldi_filter)
        for subset, result in results.items():
            write_reports(result, out_dir, report_name(ctm, subset))
        return {subset: result.total for subset, result in results.items()}
    if backend == "sclite":
        return _score_sclite(stm, ctm, out_dir, glm, kaldi_filter)
    raise AsrtrainError(f"unknown scoring backend {backend!r}; use 'python' or 'sclite'")


def _score_sclite(stm: Path, ctm: Path, out_dir: Path, glm: Path | None,
                  kaldi_filter: bool) -> dict[str, Counts]:
    from asrtrain.score.ctm import kaldi_keep, parse_ctm_line, read_lines
    from asrtrain.score.report import write_reports
    from asrtrain.score.sclite import run_hubscr, sctk_bin
    from asrtrain.score.stm import parse_stm_line

    sctk_bin()
    stm_lines = read_lines(stm, "STM")
    ctm_lines = read_lines(ctm, "CTM")
    for n, line in stm_lines:
        parse_stm_line(line, stm, n)
    for n, line in ctm_lines:
        parse_ctm_line(line, ctm, n)
    if kaldi_filter:
        ctm_lines = [(n, line) for n, line in ctm_lines if kaldi_keep(line)]
    out: dict[str, Counts] = {}
    with tempfile.TemporaryDirectory(prefix="asrtrain-score.") as tmp:
        for subset in SUBSETS:
            sub_stm = [line for _, line in stm_lines if in_subset(line, subset)]
            sub_ctm = [line for _, line in ctm_lines if in_subset(line, subset)]
            name = report_name(ctm, subset)[: -len(".filt")]
            if not any(line.strip() and not line.lstrip().startswith(";;") for line in sub_stm):
                # sclite cannot score an empty reference: report zeros like the Python scorer.
                write_reports(SystemResult(name), out_dir, f"{name}.filt")
                out[subset] = Counts()
                continue
            stm_file = Path(tmp) / f"{subset}.stm"
            ctm_file = Path(tmp) / name
            stm_file.write_text("".join(x + "\n" for x in sub_stm), encoding="latin-1")
            ctm_file.write_text("".join(x + "\n" for x in sub_ctm), encoding="latin-1")
            _, total = run_hubscr(stm_file, ctm_file, glm, out_dir, name)
            out[subset] = total
    return out
