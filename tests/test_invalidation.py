"""Exact invalidation on the real tiny recipe: the stages cut at Kaldi's seams, planned in-process
on records of a finished run (no training: the plan reads only the records); then, on a small
run through the real CLI, a change reruns exactly the stages downstream of it, --force reaches
inner steps, a run killed inside align resumes at the pass it was in."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import forked_cli
import pytest
from conftest import copy_exp
from test_e2e import REPO, asrtrain

from asrtrain import AsrtrainError
from asrtrain.pipeline import Pipeline, run_recipe
from asrtrain.recipe import compose_recipe
from asrtrain.stages import STAGES
from asrtrain.stages.align import pass_chain
from asrtrain.stages.decode_gmm import pass_keys

ALL = ["prepare", "lang", "features", "train", "decode", "score", "lm", "mfcc", "align",
       "fmllr", "decode_gmm", "ivectors", "train_hybrid", "decode_hybrid"]
#: What reads the GMM passes: a pass's change reaches these and nothing else.
AFTER_ALIGN = ["align", "fmllr", "decode_gmm", "train_hybrid", "decode_hybrid"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The tiny recipe as shipped (tri4 SAT, the hybrid model on its fMLLR features), every
    stage's record written as a finished run leaves it, nothing trained: what ``--dry-run``
    reads."""
    from asrtrain.models.checksum import sha256_file, write_sidecar

    exp = tmp_path_factory.mktemp("seams") / "exp"
    cfg = compose_recipe("recipes/tiny", [f"exp_dir={exp}"])
    pipeline = Pipeline(cfg, STAGES)
    pipeline.paths.markers.mkdir(parents=True)
    for name in pipeline.names:
        pipeline.record(name)
    for model in (cfg.model.name, cfg.hybrid.model.name):   # the training stages' verify
        final = pipeline.paths.model_dir(str(model)) / "final.pt"
        final.parent.mkdir(parents=True)
        final.write_bytes(b"a finished model, as far as the plan can tell")
        write_sidecar(final, sha256_file(final))
    return exp


def dry_run(exp: Path, capsys, *overrides: str) -> list[str]:
    """The stages ``asrtrain run recipes/tiny --dry-run`` plans (in-process), checking the
    listing names every stage."""
    cfg = compose_recipe("recipes/tiny", [f"exp_dir={exp}", *overrides])
    todo = run_recipe(cfg, STAGES, dry_run=True)
    listing = capsys.readouterr().out
    assert [ln.split()[0] for ln in listing.splitlines() if ln.strip()] == ALL, listing
    return todo


def test_the_records_of_a_finished_run_plan_nothing(recorded: Path, capsys) -> None:
    assert dry_run(recorded, capsys) == []


def test_an_lm_change_plans_only_decoding_stages(recorded: Path, capsys) -> None:
    """No GMM pass, no fMLLR features, no training: the graphs and what decodes through them."""
    assert dry_run(recorded, capsys, "lm.order=2") == ["lm", "decode_gmm", "decode_hybrid"]
    assert dry_run(recorded, capsys, "align.decode=false") == ["decode_gmm", "decode_hybrid"]
    # decode.sh's options (the search of the GMM passes' decoding): likewise
    assert dry_run(recorded, capsys, "+align.decode_options.beam=10") == [
        "decode_gmm", "decode_hybrid"]


def test_a_bad_gmm_decode_option_is_one_line_naming_it(recorded: Path, capsys) -> None:
    with pytest.raises(AsrtrainError, match=r"^align\.decode_options\.beams: unknown setting; "
                       r"known: acoustic_scales, beam, device, max_active, self_loop_scale, "
                       r"transition_scale$"):
        dry_run(recorded, capsys, "+align.decode_options.beams=10")
    with pytest.raises(AsrtrainError, match=r"^align\.decode_options\.max_active="):
        dry_run(recorded, capsys, "+align.decode_options.max_active=many")


def test_a_lexicon_change_does_not_plan_the_ctc_model(recorded: Path, capsys) -> None:
    # the CTC stages read lang's units only (lang:units), which sil_prob does not change
    assert dry_run(recorded, capsys, "lang.sil_prob=0.4") == ["lang", "lm", *AFTER_ALIGN]
    assert dry_run(recorded, capsys, "lang.vocab_size=99") == [
        "lang", "train", "decode", "score", "lm", *AFTER_ALIGN]


def test_a_tri4_change_keeps_mono_to_tri3(recorded: Path, capsys) -> None:
    """A tri4 option reruns align (config changed: not a fresh start): the records of the passes
    before it still hold the keys the run computes for them, so they are skipped as "done
    already", and so are their graphs and decodings in decode_gmm (which starts fresh, its input
    having rerun); tri4's are redone. A new LM redoes every graph and decoding, no pass."""
    def contexts(*overrides: str):
        cfg = compose_recipe("recipes/tiny", [f"exp_dir={recorded}", *overrides])
        pipeline = Pipeline(cfg, STAGES)
        plan = {d.stage: d for d in pipeline.plan()}
        return cfg, pipeline.context(plan["align"]), pipeline.context(plan["decode_gmm"]), plan

    def train(cfg, ctx) -> None:   # what align's run leaves: each pass's key in its .done
        for name, chain in pass_chain(cfg):
            markers[name].parent.mkdir(parents=True, exist_ok=True)
            markers[name].write_text(ctx.step_key("pass", chain) + "\n")

    cfg, ctx, decoding, _ = contexts()
    markers = {name: recorded / "align" / name / ".done" for name, _ in pass_chain(cfg)}
    assert list(markers) == ["mono", "tri1", "tri2", "tri3", "tri4"]
    train(cfg, ctx)
    before = pass_keys(decoding)
    assert all(graph and decode for graph, decode in before.values())   # align.decode: true
    try:
        change = "align.passes.tri4.num_gauss=1500"
        assert dry_run(recorded, capsys, change) == AFTER_ALIGN
        cfg, ctx, decoding, plan = contexts(change)
        assert plan["align"].reasons == [
            "config changed: align.passes.tri4.num_gauss: 1200 -> 1500"]
        assert not ctx.fresh and decoding.fresh and not decoding.forced
        done = {name: ctx.step_done(markers[name], ctx.step_key("pass", chain))
                for name, chain in pass_chain(cfg)}
        assert done == {"mono": True, "tri1": True, "tri2": True, "tri3": True, "tri4": False}
        train(cfg, ctx)
        after = pass_keys(decoding)
        assert [n for n in after if after[n] == before[n]] == ["mono", "tri1", "tri2", "tri3"]
        # a tri2 change redoes tri2 and what starts from it
        cfg, ctx, _, _ = contexts("align.passes.tri2.num_leaves=250")
        assert [name for name, chain in pass_chain(cfg)
                if ctx.step_done(markers[name], ctx.step_key("pass", chain))] == ["mono", "tri1"]
        # a new LM: every graph and decoding again; --force decode_gmm: likewise
        cfg, ctx, decoding, _ = contexts(change, "lm.order=2")
        assert all(ctx.step_done(markers[name], ctx.step_key("pass", chain))
                   for name, chain in pass_chain(cfg))
        lm = pass_keys(decoding)
        assert all(lm[n][0] != after[n][0] and lm[n][1] != after[n][1] for n in after)
        # new decoding options: every decoding again, the graphs kept
        cfg, ctx, decoding, _ = contexts(change, "+align.decode_options.max_active=2000")
        searched = pass_keys(decoding)
        assert all(searched[n][0] == after[n][0] and searched[n][1] != after[n][1]
                   for n in after)
        pipeline = Pipeline(compose_recipe("recipes/tiny", [f"exp_dir={recorded}", change]),
                            STAGES)
        forced = {d.stage: d for d in pipeline.plan(force=["decode_gmm"])}["decode_gmm"]
        keys = pass_keys(pipeline.context(forced))
        assert all(keys[n][1] != after[n][1] for n in after)
    finally:
        for marker in markers.values():
            marker.unlink()


def test_a_hybrid_recipe_without_the_split_stages_is_refused(tmp_path: Path) -> None:
    """A stage list of before the split (align made the graphs and the fMLLR features): one
    line that gives the list to use."""
    from asrtrain import AsrtrainError

    with pytest.raises(AsrtrainError) as e:
        compose_recipe("recipes/tiny", [f"exp_dir={tmp_path}", "stages=[prepare,lang,features,"
                                        "lm,mfcc,align,ivectors,train_hybrid,decode_hybrid]"])
    assert str(e.value) == (
        "stages: align.decode=true and train_hybrid and decode_hybrid need fmllr (the fMLLR "
        "features) and decode_gmm (the GMM passes' graphs and decoding), stages of their own "
        "since align was split: list them: stages: [prepare, lang, features, lm, mfcc, align, "
        "fmllr, decode_gmm, ivectors, train_hybrid, decode_hybrid]")
    with pytest.raises(AsrtrainError) as e:
        compose_recipe("recipes/tiny", [f"exp_dir={tmp_path}", "stages=[prepare,lang,lm,mfcc,"
                                        "align]"])
    assert str(e.value) == (
        "stages: align.decode=true needs decode_gmm (the GMM passes' graphs and decoding), a "
        "stage of its own since align was split: list it: stages: [prepare, lang, lm, mfcc, "
        "align, decode_gmm] (or align.decode=false)")
    # without decoding, the GMM passes alone are a whole recipe
    gmm = compose_recipe("recipes/tiny", [f"exp_dir={tmp_path}", "align.decode=false",
                                          "stages=[prepare,lang,lm,mfcc,align]"])
    assert list(gmm.stages) == ["prepare", "lang", "lm", "mfcc", "align"]


@pytest.fixture(scope="module")
def done(tiny_trained: dict, tmp_path_factory) -> list[str]:
    """A finished small run of the whole tiny recipe (a copy of conftest's tiny_trained: SMALL,
    ALIGN_SMALL, HYBRID_SMALL), which these tests change; returns its command-line settings."""
    exp = copy_exp(tiny_trained["exp"], tmp_path_factory.mktemp("invalidation") / "exp")
    assert [s for s in ALL if (exp / ".done" / s).is_file()] == ALL
    return [*tiny_trained["args"], f"exp_dir={exp}"]


def _exp(args: list[str]) -> Path:
    return Path(next(a for a in args if a.startswith("exp_dir="))[len("exp_dir="):])


def plan(args: list[str], *extra: str) -> list[str]:
    """The stages ``asrtrain run --dry-run`` says would run: the run command in this process
    (click's runner), a stage process's start-up saved; the runs themselves are the CLI's."""
    from click.testing import CliRunner

    from asrtrain.cli import run as run_command

    with contextlib.chdir(REPO):   # the recipe path is the repository's, as the CLI runs
        result = CliRunner().invoke(run_command, [*args, *extra, "--dry-run"])
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    lines = [ln.split(None, 2) for ln in result.stdout.splitlines() if ln.strip()]
    assert [ln[0] for ln in lines] == ALL
    return [name for name, what, *_ in lines if what == "runs:"]


def ran(out: subprocess.CompletedProcess) -> list[str]:
    return [s for s in ALL if f"stage {s:<13} starts" in out.stderr]


def test_nothing_to_do_after_a_whole_run(done: list[str]) -> None:
    assert plan(done) == []


def test_an_mfcc_change_reruns_the_gmm_branch_and_not_ctc(done: list[str]) -> None:
    assert plan(done, "mfcc.dither=0.5") == ["mfcc", *AFTER_ALIGN]


def test_a_ctc_decode_change_reruns_only_decode_and_score(done: list[str]) -> None:
    out = asrtrain("run", *done, "decode.batch_frames=12345")
    assert ran(out) == ["decode", "score"]
    assert "config changed: decode.batch_frames: 20000 -> 12345" in out.stderr
    assert plan(done, "decode.batch_frames=12345") == []
    assert ran(asrtrain("run", *done)) == ["decode", "score"]     # and back again


def test_a_scoring_change_rescores_every_system(done: list[str], tmp_path: Path) -> None:
    """score.* reruns the score stage, and the hybrid row, which decode_hybrid scored, is scored
    again with the same options: RESULTS.md never mixes scorings."""
    import json
    import shutil

    from asrtrain.score import counts_json, score_decode

    exp = _exp(done)

    def rows() -> dict[str, Path]:
        return {d.parent.name: d for d in exp.glob("decode/*/eval2000")
                if (d / "score" / "result.json").is_file()}

    assert set(rows()) == {"blstm_tiny", "hybrid_tiny"}
    for kaldi_filter, extra in ((False, ["score.kaldi_filter=false"]), (True, [])):
        out = asrtrain("run", *done, *extra)
        assert ran(out) == ["score"]
        assert "rescored hybrid_tiny eval2000 (scored with backend=python, kaldi_filter=" \
            f"{not kaldi_filter}; now backend=python, kaldi_filter={kaldi_filter}" in out.stderr
        for system, dec in rows().items():
            record = json.loads((dec / "score" / "scoring.json").read_text())
            assert record == {"rules": "hub5", "kaldi_filter": kaldi_filter,
                              "backend": "python"}, system
            copy = tmp_path / f"{system}-{kaldi_filter}"
            copy.mkdir()
            shutil.copy(dec / "ctm", copy / "ctm")
            expected = counts_json(score_decode(exp / "data" / "eval2000", copy,
                                                kaldi_filter=kaldi_filter))
            result = json.loads((dec / "score" / "result.json").read_text())
            assert result["wer"] == expected, system
            wer = result["wer"]["all"]
            assert f"| {system} |" in (exp / "RESULTS.md").read_text()
            assert f"WER {wer['wer']:.2f}% [ {wer['err']} / {wer['ref_words']}," in \
                (dec / "score" / "wer").read_text()
    assert plan(done) == []


def test_a_corpus_change_reaches_every_stage(done: list[str]) -> None:
    assert plan(done, "corpus.dev_utts=39") == ALL


def test_launch_settings_rerun_nothing_and_more_epochs_only_training(done: list[str]) -> None:
    assert plan(done, "trainer.threads=2", "trainer.log_every=7") == []
    assert plan(done, "hybrid.trainer.epochs=2") == ["train_hybrid", "decode_hybrid"]


def test_a_stale_input_outside_the_range_is_one_clear_error(done: list[str]) -> None:
    proc = forked_cli.run("run", *done,
                          "features.num_mel_bins=30", "--stage", "train", timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert ("stage train reads features, which is not up to date (config changed: "
            "features.num_mel_bins: 40 -> 30)") in proc.stderr


def test_force_reruns_the_stage_and_its_inner_steps_a_kill_resumes_at_its_pass_readers_follow(
        done: list[str]) -> None:
    """One forced align run (two tests merged: each forced align once): ``--force align``
    reruns align alone and its inner steps (mono, done before, is trained again); killed with
    SIGKILL inside align, once mono is done again, the next run resumes at tri1; then what
    reads align must follow: its record names the align digest it was made from."""
    assert plan(done, "--force", "mfcc") == ["mfcc", *AFTER_ALIGN]
    exp = _exp(done)
    before = (exp / "align" / "mono" / "final.mdl").stat().st_mtime_ns
    # warm, in a session of its own (bench/forked_cli.py)
    proc = forked_cli.popen("run", *done, "--force", "align", "--to", "align")
    mono_done = exp / "align" / "mono" / ".done"
    deadline = time.time() + 900
    try:
        # the forced run first removes mono's marker, then writes it once mono is trained
        while mono_done.is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        while not mono_done.is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "align finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    forced = proc.communicate()[1]
    assert [s for s in ALL if f"stage {s:<13} starts" in forced] == ["align"], forced[-3000:]
    assert "done already" not in forced, forced[-3000:]
    assert (exp / "align" / "mono" / "final.mdl").stat().st_mtime_ns != before
    # tri1's marker may still be the killed run's predecessor's (a pass's marker goes when the
    # pass starts, and the kill may land just before): its key is of the old generation, so the
    # resume below must train tri1 again ("align tri1: done already" not said)
    assert not (exp / ".done" / "align").is_file()
    out = asrtrain("run", *done, "--to", "align")
    assert ran(out) == ["align"]
    assert "align mono: done already" in out.stderr
    assert "align tri1: done already" not in out.stderr
    assert (exp / "align" / "tri1" / ".done").is_file()
    assert plan(done) == AFTER_ALIGN[1:]


def test_a_bad_trainer_value_is_refused_before_anything_moves(done: list[str]) -> None:
    exp = _exp(done)
    before = sorted(p.name for p in (exp / "train").iterdir())
    final = (exp / "train" / "blstm_tiny" / "final.pt").read_bytes()
    proc = forked_cli.run("run", *done, "trainer.lr=-1", timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "trainer.lr" in proc.stderr and "starts" not in proc.stderr
    assert sorted(p.name for p in (exp / "train").iterdir()) == before
    assert (exp / "train" / "blstm_tiny" / "final.pt").read_bytes() == final
