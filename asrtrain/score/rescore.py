"""One scoring for every row of RESULTS.md: the decode dirs of an experiment scored with other
``score.*`` options than the recipe's now (a CTC row rescored by the ``score`` stage after
``score.kaldi_filter=false``, a hybrid row still filtered) are scored again with the recipe's.

Scoring is cheap beside decoding and reads only a decode dir's words, so the pipeline calls
``rescore_stale`` at the end of every run (``asrtrain run``): whichever stages a change reran,
every row of ``RESULTS.md`` is then scored with the same options. A graph decoder's setting
(LM weight, acoustic scale) chosen under the old options is kept; only its counts change.

Usage::

    rescored = rescore_stale(Path("exp/tiny"), {"kaldi_filter": False, "backend": "python"})
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text

log = logging.getLogger("asrtrain")


def _result_dirs(exp: Path) -> list[Path]:
    """The decode dirs of ``exp`` with a scored result (not one being written)."""
    out = []
    for result in sorted(exp.glob("decode/*/*/score/result.json")):
        if not any(part.startswith(".") for part in result.relative_to(exp).parts):
            out.append(result.parent.parent)
    return out


def recorded_options(decode_dir: Path) -> dict | None:
    """The rules and options ``decode_dir`` was scored with, or None (scored before they were
    recorded)."""
    try:
        record = json.loads((decode_dir / "score" / "scoring.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def stale(exp: Path, options: dict) -> list[tuple[Path, dict | None]]:
    """The decode dirs of ``exp`` scored with options other than ``options`` (Hub5 rows only:
    plain WER has none), with what they were scored with."""
    from asrtrain.score import scoring_record

    out = []
    for dec in _result_dirs(Path(exp)):
        data_dir = Path(exp) / "data" / dec.name
        if not data_dir.is_dir():
            continue          # its data set is gone: nothing to score against
        want = scoring_record(data_dir, options["kaldi_filter"], options["backend"])
        have = recorded_options(dec)
        if have != want and not (have is None and want["rules"] == "plain"):
            out.append((dec, have))
    return out


def _describe(options: dict | None) -> str:
    if options is None:
        return "unrecorded options"
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items()) if k != "rules") or "none"


def rescore_stale(exp: Path, options: dict) -> list[Path]:
    """Score again every decode dir of ``exp`` scored with other options than ``options``
    (``kaldi_filter``, ``backend``): its reports, ``score/wer``, the counts of its
    ``result.json`` and ``decode.json``; then ``RESULTS.md``. Returns the decode dirs."""
    from asrtrain.report import write_results
    from asrtrain.score import counts_json, report_wer, score_decode

    exp = Path(exp)
    done = []
    for dec, before in stale(exp, options):
        result_path = dec / "score" / "result.json"
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError) as e:
            raise AsrtrainError(f"{result_path}: not a result record ({e}); rescore, or delete "
                                "it") from e
        missing = [f for f in ("ctm", "text") if not (dec / f).is_file()]
        if missing:
            log.warning("%s: scored with %s, but its %s is gone: not rescored", dec,
                        _describe(before), " and ".join(missing))
            continue
        counts = score_decode(exp / "data" / dec.name, dec, kaldi_filter=options["kaldi_filter"],
                              backend=options["backend"])
        system = str(result.get("system", dec.parent.name))
        log.info("rescored %s %s (scored with %s; now %s, as score.* says)", system, dec.name,
                 _describe(before), _describe(recorded_options(dec)))
        report_wer(dec.name, system, counts, dec / "score")
        result["wer"] = counts_json(counts)
        write_text(result_path, json.dumps(result, indent=1) + "\n")
        summary_path = dec / "decode.json"
        if summary_path.is_file():
            try:
                summary = json.loads(summary_path.read_text())
            except ValueError:
                summary = None
            if isinstance(summary, dict) and "wer" in summary:
                summary["wer"] = counts_json(counts)
                write_text(summary_path, json.dumps(summary, indent=1) + "\n")
        done.append(dec)
    if done:
        write_results(exp)
    return done
