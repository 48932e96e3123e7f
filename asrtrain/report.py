"""Results at a glance: one table of every system and GMM pass scored in an experiment.

As Kaldi's ``RESULTS`` and ESPnet's ``RESULTS.md``: every scoring step (the ``score``, ``align``
and ``decode_hybrid`` stages) leaves ``<decode dir>/score/result.json`` beside its reports (the
WER per subset, the decoding setting used and where it was chosen, which of the training run's
models was decoded (``decode.checkpoint``, from the decode dir's ``decode.json``), the stage and
its config digest, the date) and rewrites ``<exp>/RESULTS.md`` from all of them; ``asrtrain run``
ends by printing the short table, skipped stages included, and ``asrtrain report`` prints the
whole one. Decode dirs of an older version, scored before ``result.json`` existed, are not
listed: their stages rerun (README).

Usage::

    record_result(ctx, dec, "tri2", "GMM", "eval2000", counts, data_dir,
                  {"acoustic_scale": 0.0833}, "eval2000")
    write_results(paths.exp)          # exp/tiny/RESULTS.md
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from asrtrain import AsrtrainError
from asrtrain.fileio import write_text

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from asrtrain.pipeline import StageContext
    from asrtrain.score import Counts

RESULT = "result.json"
RESULTS_MD = "RESULTS.md"
#: The scoring stages in pipeline order, and the kind of system each scores.
STAGE_KINDS = {"score": "CTC", "decode_gmm": "GMM", "decode_hybrid": "hybrid"}
SUBSET_NAMES = {"all": "WER", "swbd": "SWB", "callhm": "CallHome"}


@dataclass
class Result:
    """One scored decode: ``wer`` per subset as ``counts_json`` gives it (``wer`` in percent,
    ``sub``, ``dels``, ``ins``, ``ref_words``, ...); ``chosen_on`` is the set the setting was
    chosen on, ``"config"`` when it was fixed, None when there was nothing to choose;
    ``checkpoint`` says which of a neural model's epochs were decoded (None: a GMM pass, or a
    decode older than ``decode.checkpoint``)."""

    system: str
    kind: str
    set: str
    scoring: str
    wer: dict[str, dict]
    setting: dict
    chosen_on: str | None
    stage: str
    digest: str | None
    date: str | None
    time: float = 0.0
    checkpoint: str | None = None


def record_result(ctx: StageContext, decode_dir: Path, system: str, kind: str, set_name: str,
                  counts: Mapping[str, Counts], data_dir: Path, setting: Mapping,
                  chosen_on: str | None) -> None:
    """Write ``decode_dir/score/result.json`` for the running stage (its name and digest)."""
    from asrtrain.score import counts_json, scoring_of

    result = Result(system, kind, set_name, scoring_of(data_dir), counts_json(dict(counts)),
                    dict(setting), chosen_on, ctx.stage.name, ctx.digest,
                    time.strftime("%Y-%m-%d %H:%M"), time.time(), decoded_checkpoint(decode_dir))
    write_text(Path(decode_dir) / "score" / RESULT, json.dumps(asdict(result), indent=1) + "\n")


def decoded_checkpoint(decode_dir: Path) -> str | None:
    """Which of the training run's models a decode dir's ``decode.json`` says was decoded
    (e.g. "average of epochs 7, 9, 10 (dev loss ...)"), or None."""
    path = Path(decode_dir) / "decode.json"
    if not path.is_file():
        return None
    try:
        chosen = json.loads(path.read_text()).get("checkpoint")
    except (ValueError, AttributeError) as e:
        raise AsrtrainError(f"{path}: not a decode summary ({e}); decode again") from e
    return str(chosen["description"]) if isinstance(chosen, dict) and chosen.get(
        "description") else None


def chosen_on(n_settings: int, set_name: str, tuned_on: str | None) -> str | None:
    """Where a graph decoder's setting came from: the dev set it was tuned on, ``config`` when
    the config fixed it, else the scored set itself (Kaldi's habit)."""
    return tuned_on or ("config" if n_settings == 1 else set_name)


# ---------------------------------------------------------------------------- reading
def collect(exp: Path) -> list[Result]:
    """Every scored decode dir of ``exp``, in pipeline order (CTC, GMM passes, hybrid), then in
    the order they were scored."""
    exp = Path(exp)
    results = []
    for score_dir in sorted(exp.glob("decode/*/*/score")):
        if any(part.startswith(".") for part in score_dir.relative_to(exp).parts):
            continue      # a decode dir being written (atomic_dir's temporary name)
        if (score_dir / RESULT).is_file():
            results.append(_read(score_dir / RESULT))
    order = list(STAGE_KINDS)
    return sorted(results, key=lambda r: (order.index(r.stage) if r.stage in order else
                                          len(order), r.time, r.system, r.set))


def _read(path: Path) -> Result:
    try:
        return Result(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise AsrtrainError(f"{path}: not a result record ({e}); rescore, or delete it") from e


# ---------------------------------------------------------------------------- formatting
def _wer(r: Result, subset: str) -> str:
    return f"{r.wer[subset]['wer']:.2f}" if subset in r.wer else "–"


def _errors(r: Result) -> str:
    c = r.wer.get("all", {})
    return f"{c.get('sub', 0)} / {c.get('dels', 0)} / {c.get('ins', 0)}"


def _setting(r: Result) -> str:
    s = r.setting
    if "lmwt" in s:
        return f"LM weight {s['lmwt']}, insertion penalty {s['wip']}"
    if "acoustic_scale" in s:
        return f"acoustic scale {s['acoustic_scale']:.4g} (LM weight {1 / s['acoustic_scale']:.3g})"
    return str(s.get("decoder", "–"))


def _chosen(r: Result) -> str:
    if r.chosen_on is None:
        return "–"
    return chosen_words(r.set, r.chosen_on)


def chosen_words(set_name: str, chosen_on: str) -> str:
    """The one wording of where a decode's setting came from, for RESULTS.md's *chosen on*
    column, the decode logs and ``decode.json`` alike: ``eval2000 itself (optimistic)`` (the
    best of the settings on the scored set, Kaldi's habit), ``train_dev (held out)`` (the best
    on the dev set, then fixed for the test sets: ``score.tune_on``), ``fixed by the config``."""
    if chosen_on == "config":
        return "fixed by the config"
    if chosen_on == set_name:
        return f"{set_name} itself (optimistic)"
    return f"{chosen_on} (held out)"


def selection(set_name: str, n_settings: int, tuned_on: str | None = None) -> str:
    """A decoder's sentence for where its setting came from (``chosen_words``, with the number
    of settings it chose among)."""
    where = chosen_on(n_settings, set_name, tuned_on)
    if where == "config":
        return chosen_words(set_name, where)
    among = f", the best of {n_settings}" if where == set_name else ""
    return f"chosen on {chosen_words(set_name, where)}{among}"


def _subsets(results: Sequence[Result]) -> list[str]:
    """The subset columns to show: SWB and CallHome only where a scored set has them (Hub5
    scoring of an eval2000-style set); a plain corpus shows its WER alone."""
    return ["all"] + [s for s in ("swbd", "callhm") if any(s in r.wer for r in results)]


def _digest(r: Result, current: Mapping[str, str | None]) -> str:
    if not r.digest:
        return f"{r.stage} (unrecorded)"
    now = current.get(r.stage)
    older = " (an earlier run)" if now and now != r.digest else ""
    return f"{r.stage} {r.digest[:8]}{older}"


def _current_digests(exp: Path) -> dict[str, str | None]:
    from asrtrain.records import read_marker

    return {s: (read_marker(Path(exp) / ".done" / s) or {}).get("digest") for s in STAGE_KINDS}


def results_markdown(exp: Path, results: Sequence[Result]) -> str:
    """``RESULTS.md``: a short preamble, then one row per scored decode dir."""
    current = _current_digests(exp)
    subsets = _subsets(results)
    header = ["system", "kind", "set", *(SUBSET_NAMES[s] for s in subsets), "sub / del / ins",
              "words", "setting", "chosen on", "model decoded", "stage digest", "date"]
    rows = [[r.system, r.kind, r.set, *(_wer(r, s) for s in subsets), _errors(r),
             str(r.wer.get("all", {}).get("ref_words", "–")), _setting(r), _chosen(r),
             r.checkpoint or "–", _digest(r, current), r.date or "–"]
            for r in results]
    lines = [f"# Results: {exp}", "",
             "Every system and GMM pass scored so far, rewritten by each scoring step (the score, "
             "align and decode_hybrid stages); `asrtrain report` prints it. WER in percent: "
             "Hub5 scoring (hubscr.pl's Sum/Avg, with SWB and CallHome) for sets with an stm, "
             "plain per-utterance WER of the text otherwise (no SWB and CallHome columns when no "
             "set has them). *setting*: the LM weight and "
             "insertion penalty (hybrid) or acoustic scale (GMM) used; *chosen on*: the test set "
             "itself (Kaldi's habit, an optimistic figure), the dev set (held out: "
             "`score.tune_on`), or the config. *model decoded*: which of the training run's "
             "epochs a CTC or hybrid decode used (`decode.checkpoint`, "
             "`hybrid.decode.checkpoint`: best, last, or an average by dev loss). *stage "
             "digest*: the stage's config digest (`.done/<stage>`) when it scored. Reports: "
             "`decode/<system>/<set>/score/`.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def results_text(results: Sequence[Result]) -> str:
    """The short table ``asrtrain run`` ends with (no line starts with a set name)."""
    subsets = _subsets(results)
    header = ["system", "kind", "set", *(SUBSET_NAMES[s] for s in subsets), "sub/del/ins",
              "chosen on"]
    rows = [header] + [[r.system, r.kind, r.set, *(_wer(r, s) for s in subsets),
                        _errors(r).replace(" ", ""), _chosen(r)] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows) + "\n"


def write_results(exp: Path) -> Path | None:
    """Rewrite ``exp/RESULTS.md`` from every scored decode dir (None: nothing scored yet)."""
    results = collect(exp)
    if not results:
        return None
    path = Path(exp) / RESULTS_MD
    write_text(path, results_markdown(Path(exp), results))
    return path


def print_summary(cfg: DictConfig, dry_run: bool = False) -> None:
    """The end of ``asrtrain run``: every system's WER stored in the exp dir, whichever stages
    ran (a run that skipped every stage still shows them); writes ``RESULTS.md`` if an older
    run left none."""
    exp = Path(cfg.exp_dir)
    if dry_run or not exp.is_dir():
        return
    results = collect(exp)
    if not results:
        return
    if not (exp / RESULTS_MD).is_file():
        write_results(exp)
    click.echo(f"Results ({exp / RESULTS_MD}):\n" + results_text(results), nl=False)


# ---------------------------------------------------------------------------- command
def _exp_dir(target: Path, overrides: Sequence[str]) -> Path:
    if (target / "recipe.yaml").is_file():
        from asrtrain.recipe import compose_recipe

        return Path(compose_recipe(target, overrides).exp_dir)
    if overrides:
        raise AsrtrainError(f"{target}: overrides {' '.join(overrides)} need a recipe dir "
                            "(with recipe.yaml), not an exp dir")
    return target


@click.command("report", context_settings={"ignore_unknown_options": True})
@click.argument("target", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
@click.option("--short", is_flag=True, help="The short table `asrtrain run` ends with.")
@click.option("--write", is_flag=True, help="Also rewrite <exp>/RESULTS.md.")
def report_command(target: Path, overrides: tuple[str, ...], short: bool, write: bool) -> None:
    """Print the results table of an experiment: TARGET is a recipe dir (with its OVERRIDES,
    e.g. `exp_dir=...`) or an exp dir, e.g. `asrtrain report recipes/tiny`."""
    exp = _exp_dir(target, overrides)
    results = collect(exp) if exp.is_dir() else []
    if not results:
        raise AsrtrainError(f"{exp}: no scored system (no decode/<system>/<set>/score/"
                            f"{RESULT}); run the recipe's decoding and scoring stages first")
    if write:
        write_results(exp)
    click.echo(results_text(results) if short else results_markdown(exp, results), nl=False)
