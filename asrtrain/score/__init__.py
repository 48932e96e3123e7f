"""Scoring: Hub5'00-style scoring whose counts equal NIST SCTK's hubscr.pl/sclite, in pure Python.

``score_decode`` is the one scoring entry every decoder and the score stage call: a decode dir
(``ctm``, ``text``) is scored against its data dir, with Hub5 rules when the data dir has an
``stm`` (subsets all, swbd: files not starting ``en_``, callhm: files not starting ``sw_``),
otherwise as plain per-utterance WER on ``text``; reports go to ``<decode dir>/score/``.
``report_wer`` prints the one-line WER summaries.  ``Counts`` is the one WER record.
``score_hub5`` scores any CTM against an STM; the ``sclite`` backend runs SCTK itself.

Usage::

    counts = score_decode(Path("exp/data/eval2000"), Path("exp/decode/tri2/eval2000"))
    report_wer("eval2000", "tri2", counts, Path("exp/decode/tri2/eval2000/score"))
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from asrtrain import STAGE_LOG_ONLY, AsrtrainError
from asrtrain.data.datadir import read_table, write_table
from asrtrain.fileio import write_text
from asrtrain.score.align import Counts, align_words
from asrtrain.score.hub5 import SUBSETS, SystemResult, in_subset, read_checked, score_hub5_python
from asrtrain.score.plain import score_text, wer_counts

__all__ = ["Counts", "SUBSETS", "align_words", "counts_json", "describe_scoring", "report_name",
           "report_wer", "score_decode", "score_hub5", "scoring_of", "scoring_options",
           "set_scoring_options", "wer_counts"]

BACKENDS = ("python", "sclite")
#: What ``score_decode`` writes beside its reports: the rules and options it scored with.
SCORING_RECORD = "scoring.json"
_OPTIONS = {"kaldi_filter": True, "backend": "python"}


def set_scoring_options(kaldi_filter: bool = True, backend: str = "python") -> None:
    """The options every ``score_decode`` of this process uses unless its caller gives them:
    the pipeline sets the recipe's ``score.*`` before each stage, so the GMM and hybrid
    decoders' scoring follows them as the ``score`` stage's does."""
    if backend not in BACKENDS:
        raise AsrtrainError(f"score.backend={backend!r}: use 'python' or 'sclite'")
    _OPTIONS.update(kaldi_filter=bool(kaldi_filter), backend=str(backend))


def scoring_options() -> dict:
    """The options ``score_decode`` uses by default (``set_scoring_options``)."""
    return dict(_OPTIONS)


def scoring_record(data_dir: Path, kaldi_filter: bool, backend: str) -> dict:
    """What decides a decode dir's counts besides the words: the rules, and for Hub5 the
    options (plain WER has no filter and is always scored in Python)."""
    if scoring_of(data_dir) == "plain":
        return {"rules": "plain"}
    return {"rules": "hub5", "kaldi_filter": bool(kaldi_filter), "backend": str(backend)}

log = logging.getLogger(__name__)


def score_decode(data_dir: Path, decode_dir: Path, *, kaldi_filter: bool | None = None,
                 backend: str | None = None) -> dict[str, Counts]:
    """Score a decode dir against its data dir; the counts per subset.

    With ``data_dir/stm``: Hub5 scoring of ``decode_dir/ctm`` (GLM ``data_dir/glm`` if present)
    for all, swbd and callhm, reports ``decode_dir/score/ctm[.swbd|.callhm].filt.*`` (see
    ``score_hub5`` for ``kaldi_filter`` and ``backend``).  Without: the plain WER of
    ``decode_dir/text`` against ``data_dir/text`` (subset ``all`` only, always in Python, no
    filter), reports ``decode_dir/score/text.{sys,raw,dtl,pra}``. Options not given are the
    process's (``set_scoring_options``); ``score/scoring.json`` records those used."""
    data_dir, decode_dir = Path(data_dir), Path(decode_dir)
    kaldi_filter = _OPTIONS["kaldi_filter"] if kaldi_filter is None else kaldi_filter
    backend = _OPTIONS["backend"] if backend is None else backend
    if backend not in BACKENDS:
        raise AsrtrainError(f"unknown scoring backend {backend!r}; use 'python' or 'sclite'")
    if not data_dir.is_dir():
        raise AsrtrainError(f"{data_dir}: not a data directory (the reference to score against)")
    score_dir = decode_dir / "score"
    if (data_dir / "stm").is_file():
        _need(decode_dir / "ctm", "the decoder writes it; run the decode first")
        glm = data_dir / "glm"
        counts = score_hub5(data_dir / "stm", decode_dir / "ctm", score_dir,
                            glm if glm.is_file() else None, kaldi_filter, backend)
    else:
        _need(data_dir / "text", f"no stm in {data_dir} either: nothing to score against")
        _need(decode_dir / "text", "the decoder writes it; run the decode first")
        utt2spk = (read_table(data_dir / "utt2spk") if (data_dir / "utt2spk").is_file()
                   else None)
        log.debug("%s: no stm; plain WER of each utterance", data_dir)
        counts = {"all": score_text(data_dir / "text", decode_dir / "text", score_dir, utt2spk)}
    write_text(score_dir / SCORING_RECORD,
               json.dumps(scoring_record(data_dir, kaldi_filter, backend), sort_keys=True) + "\n")
    log.debug("scored %s: %s", decode_dir,
              ", ".join(f"{k} {c.wer:.2f}%" for k, c in counts.items()))
    return counts


def scoring_of(data_dir: Path) -> str:
    """How ``score_decode`` scores against ``data_dir``: ``hub5`` (it has an stm) or ``plain``."""
    return "hub5" if (Path(data_dir) / "stm").is_file() else "plain"


def describe_scoring(data_dir: Path) -> str:
    """One line for the logs that says which rules apply, and claims Hub5 rules only where they
    do."""
    data_dir = Path(data_dir)
    if scoring_of(data_dir) == "hub5":
        glm = "with its glm" if (data_dir / "glm").is_file() else "without a glm"
        return (f"Hub5 rules: ctm against {data_dir / 'stm'} {glm}, for all, swbd and callhm")
    return (f"plain per-utterance WER of text against {data_dir / 'text'} (no stm, so no Hub5 "
            "rules: no glm, no CTM filter, no subsets)")


def _need(path: Path, why: str) -> None:
    if not path.is_file():
        raise AsrtrainError(f"{path}: missing ({why})")


def report_wer(set_name: str, system: str, counts: dict[str, Counts], score_dir: Path) -> None:
    """Print (stdout, once), log (the stage's log file) and write to ``score_dir/wer`` one line
    per subset (all, swbd, callhm):
    ``eval2000 all: WER 7.19% [ 41 / 570, 9 ins, 5 del, 27 sub ] hybrid_tiny``."""
    table, lines = {}, []
    for subset, c in counts.items():
        value = (f"WER {100.0 * c.err / max(c.ref_words, 1):.2f}% [ {c.err} / {c.ref_words}, "
                 f"{c.ins} ins, {c.dels} del, {c.sub} sub ] {system}")
        table[f"{set_name}_{subset}"] = value
        lines.append(f"{set_name} {subset}: {value}")
        log.info("%s", lines[-1], extra=STAGE_LOG_ONLY)   # the console has it on stdout
    write_table(Path(score_dir) / "wer", table)
    print("\n".join(lines), flush=True)


def counts_json(counts: dict[str, Counts]) -> dict[str, dict]:
    """Counts per subset as plain numbers for a JSON summary (``wer`` in percent, 2 decimals)."""
    return {subset: {"wer": round(c.wer, 2), **c.as_dict()} for subset, c in counts.items()}


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
    if backend not in BACKENDS:
        raise AsrtrainError(f"unknown scoring backend {backend!r}; use 'python' or 'sclite'")
    if backend == "python":
        results = score_hub5_python(stm, ctm, glm, kaldi_filter)
        for subset, result in results.items():
            write_reports(result, out_dir, report_name(ctm, subset))
        return {subset: result.total for subset, result in results.items()}
    return _score_sclite(stm, ctm, out_dir, glm, kaldi_filter)


def _score_sclite(stm: Path, ctm: Path, out_dir: Path, glm: Path | None,
                  kaldi_filter: bool) -> dict[str, Counts]:
    from asrtrain.score.report import write_reports
    from asrtrain.score.sclite import run_hubscr, sctk_bin

    sctk_bin()
    stm_lines, ctm_lines = read_checked(stm, ctm, kaldi_filter)
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
