"""``asrtrain score``: Hub5 scoring of a CTM against an STM, sclite-style reports for all/SWB/CH."""

from __future__ import annotations

from pathlib import Path

import click

from asrtrain.score import SUBSETS, report_name, score_hub5
from asrtrain.score.align import Counts

_HEADER = "  Corr    Sub    Del    Ins    Err  S.Err |"
_LABELS = {"all": "all", "swbd": "SWB", "callhm": "CallHome"}


def sum_avg_row(counts: Counts, name: str) -> str:
    """A ``Sum/Avg`` row as in sclite's .sys report, prefixed with the subset name."""
    def pct(n: int, d: int) -> float:
        return 100.0 * n / d if d else 0.0

    ref = counts.ref_words
    return (f"{name:<9} | Sum/Avg | {counts.segments:5d} {ref:6d} | {pct(counts.corr, ref):5.1f} "
            f"{pct(counts.sub, ref):6.1f} {pct(counts.dels, ref):6.1f} {pct(counts.ins, ref):6.1f} "
            f"{pct(counts.err, ref):6.1f} {pct(counts.sent_err, counts.segments):6.1f} |")


@click.command("score")
@click.option("--stm", "stm", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Reference STM (with ;; LABEL headers).")
@click.option("--ctm", "ctm", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Hypothesis CTM: <file> <channel> <start> <dur> <word> [<conf>].")
@click.option("--glm", "glm", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="NIST GLM mapping file (e.g. en20000405_hub5.glm); none maps nothing.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the .sys/.raw/.dtl reports.")
@click.option("--no-filter", "no_filter", is_flag=True,
              help="Do not apply Kaldi's CTM filter (noise, <unk>, hesitations, partial words).")
@click.option("--backend", type=click.Choice(["python", "sclite"]), default="python",
              show_default=True, help="Score in Python or run NIST SCTK's hubscr.pl.")
def score_command(stm: Path, ctm: Path, glm: Path | None, out: Path, no_filter: bool,
                  backend: str) -> None:
    """Score CTM against STM like hubscr.pl (Hub5), for all, SWB (sw_) and CallHome (en_)."""
    # An AsrtrainError reaches asrtrain.cli, which prints "asrtrain: error: ..." and exits 1.
    counts = score_hub5(stm, ctm, out, glm=glm, kaldi_filter=not no_filter, backend=backend)
    click.echo(f"{'subset':<9} |         | # Snt  # Wrd |" + _HEADER)
    for subset in SUBSETS:
        click.echo(sum_avg_row(counts[subset], _LABELS[subset]))
    click.echo(f"reports: {out}/{report_name(ctm, 'all')}.sys (and .swbd, .callhm)")
