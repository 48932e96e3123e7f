"""Check, then move (issue 26): a forced or changed training run (``train``, ``train_hybrid``)
that is refused for a setting or an input leaves the finished model, its checkpoints and its
``.done`` record as they were; a run under another model name never costs the finished model its
record; the same ``--force`` command after a stop resumes what it started. Through the real CLI,
on the tiny recipe trained once per module (CTC, and the hybrid model on tri1's alignments with
online i-vectors appended)."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import forked_cli
import pytest
from conftest import copy_exp
from test_e2e import ALIGN_SMALL, HYBRID_SMALL, REPO, SMALL

from asrtrain import AsrtrainError
from asrtrain.train.config import TrainerConfig

HANG_GUARD = 900  # seconds; a hang guard for a loaded machine, never a speed assertion
MODELS = {"train": "blstm_tiny", "train_hybrid": "hybrid_tiny"}


def recipe_args(exp: Path) -> list[str]:
    return ["recipes/tiny", f"exp_dir={exp}", *SMALL, *ALIGN_SMALL, *HYBRID_SMALL,
            "++hybrid.features.append=[ivector]"]


def command(exp: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "asrtrain.cli", "run", *recipe_args(exp), *extra]


def run(exp: Path, *extra: str) -> subprocess.CompletedProcess:
    return forked_cli.run("run", *recipe_args(exp), *extra, timeout=HANG_GUARD)


@pytest.fixture(scope="module")
def trained(tiny_trained: dict, tmp_path_factory) -> Path:
    """conftest's trained tiny experiment (a copy) with the hybrid model retrained on i-vectors
    appended: only ivectors' readers run."""
    exp = copy_exp(tiny_trained["exp"], tmp_path_factory.mktemp("guards") / "exp")
    out = run(exp, "--to", "train_hybrid")
    assert out.returncode == 0, out.stderr[-3000:]
    return exp


@pytest.fixture
def exp(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "exp"
    shutil.copytree(trained, copy, symlinks=True)
    return copy


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line[line.index("asrtrain: "):] for line in re.split(r"[\r\n]", stderr)
             if "asrtrain: " in line]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def state(exp: Path, stage: str) -> dict:
    """What a refused run must leave as it was: the model dir's files, byte for byte (its
    config.yaml aside, whose paths ``asrtrain.relocate`` rewrites in a copied exp dir), the
    stage's record, and the train dir's listing (nothing moved aside)."""
    model = exp / "train" / MODELS[stage]
    return {"files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in sorted(model.iterdir())
                      if p.is_file() and p.name != "config.yaml"},  # paths a copy rewrites
            "record": (exp / ".done" / stage).read_text(),
            "train": sorted(p.name for p in (exp / "train").iterdir())}


def still_done(exp: Path, stage: str) -> None:
    """``--dry-run`` says ``stage`` is done: the run command in this process (click's runner);
    the refused runs before it are the CLI's, in processes of their own."""
    from click.testing import CliRunner

    from asrtrain.cli import run as run_command

    with contextlib.chdir(REPO):   # the recipe path is the repository's, as the CLI runs
        plan = CliRunner().invoke(run_command, [*recipe_args(exp), "--to", stage, "--dry-run"])
    assert plan.exit_code == 0, (plan.output[-3000:], plan.exception)
    assert re.search(rf"^{stage}\s+done \(digest", plan.stdout, re.M), plan.stdout


def redirect(table: Path, into: Path) -> Path:
    """Point every entry of ``table`` (a Kaldi scp) that reads the ark holding its last entry
    at a copy of that ark in ``into``; return the copy (to damage)."""
    lines = table.read_text().splitlines()
    ark = lines[-1].split(maxsplit=1)[1].rsplit(":", 1)[0]
    copy = into / f"copy-{Path(ark).name}"
    shutil.copyfile(ark, copy)
    table.write_text("".join(line.replace(f" {ark}:", f" {copy}:") + "\n" for line in lines))
    return copy


def cut(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 300)


def truncated_feature_ark(exp: Path, tmp: Path) -> None:
    cut(redirect(exp / "data" / "train_nodup" / "feats.scp", tmp))


def deleted_ali_ark(exp: Path, tmp: Path) -> None:
    redirect(exp / "align" / "tri1" / "ali.scp", tmp).unlink()


def truncated_ivector_ark(exp: Path, tmp: Path) -> None:
    cut(redirect(exp / "ivectors" / "train_nodup" / "ivector_online.scp", tmp))


def no_ivector_period(exp: Path, tmp: Path) -> None:
    (exp / "ivectors" / "train_dev" / "ivector_period").unlink()


def nothing(exp: Path, tmp: Path) -> None:
    pass


@pytest.mark.timeout(HANG_GUARD * 4)
@pytest.mark.parametrize("damage, args, stage, said", [
    (nothing, ["trainer.lr=nan", "--force", "train"], "train",
     "asrtrain: error: trainer.lr=nan: expected a finite number >= 0"),
    (nothing, ["trainer.warmup_start=inf"], "train",
     "asrtrain: error: trainer.warmup_start=inf: expected a finite number >= 0 and <= 1"),
    (nothing, ["++hybrid.trainer.lr=-inf"], "train_hybrid",
     "trainer.lr=-inf: expected a finite number >= 0"),
    (nothing, ["model.dropout=nan", "--force", "train"], "train",
     "asrtrain: error: model.dropout=nan: expected a finite number"),
    (truncated_feature_ark, ["--force", "train"], "train", "feats.scp: "),
    (truncated_feature_ark, ["model.name=other"], "train", "feats.scp: "),
    (deleted_ali_ark, ["--force", "train_hybrid"], "train_hybrid", "ali.scp: "),
    (truncated_ivector_ark, ["--force", "train_hybrid"], "train_hybrid",
     "ivector_online.scp: "),
    (no_ivector_period, ["--force", "train_hybrid"], "train_hybrid", "ivector_period: missing"),
    (nothing, ["++hybrid.features.append=[fmllr,ivector]"], "train_hybrid",
     "_fmllr/feats.scp: missing"),
], ids=["lr-nan", "warmup_start-inf", "hybrid-lr-minus-inf", "dropout-nan",
        "truncated-feature-ark", "truncated-feature-ark-other-model", "deleted-ali-ark",
        "truncated-ivector-ark", "no-ivector-period", "no-fmllr-dir"])
def test_a_refused_training_run_leaves_the_finished_model_as_it_was(
        exp: Path, tmp_path: Path, damage, args: list[str], stage: str, said: str) -> None:
    damage(exp, tmp_path)
    before = state(exp, stage)
    out = run(exp, *args, "--to", stage)
    assert out.returncode == 1, out.stderr[-3000:]
    line = one_error_line(out.stderr)
    assert said in line, line
    assert state(exp, stage) == before
    if damage is truncated_feature_ark or damage is truncated_ivector_ark:
        assert "the ark ends at byte" in line and str(tmp_path / "copy-") in line, line
    if damage is nothing:
        still_done(exp, stage)


def test_every_float_setting_of_the_trainer_must_be_finite() -> None:
    floats = [f.name for f in fields(TrainerConfig) if f.type in ("float", float)]
    assert {"lr", "momentum", "grad_clip", "anneal_factor", "timeout_s"} <= set(floats)
    for name in floats:
        for value in (math.nan, math.inf, -math.inf):
            with pytest.raises(AsrtrainError, match=rf"^trainer\.{name}=(nan|-?inf): expected "
                                                    "a finite number"):
                TrainerConfig.from_config({name: value})


def wait_for(path: Path, proc: forked_cli.Started) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not path.is_file():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (status {proc.returncode}) before {path}:\n"
                                 + proc.communicate()[1][-3000:])
        assert time.monotonic() < deadline, f"gave up waiting for {path}"
        time.sleep(0.1)


def stop(proc: forked_cli.Started) -> str:
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 143, stderr[-3000:]
    return one_error_line(stderr)


def start(exp: Path, *extra: str) -> forked_cli.Started:
    """The command started warm, not waited for (bench/forked_cli.py: a process of its own, in
    a session of its own)."""
    return forked_cli.popen(*command(exp, *extra)[3:])


@pytest.mark.timeout(HANG_GUARD * 3)
def test_a_stopped_run_under_another_model_name_keeps_the_finished_models_record(
        exp: Path) -> None:
    before = state(exp, "train")
    proc = start(exp, "model.name=other", "trainer.epochs=400", "--to", "train")
    wait_for(exp / "train" / "other" / "epoch-2.pt", proc)
    stop(proc)
    assert state(exp, "train") == {**before, "train": sorted([*before["train"], "other"])}
    still_done(exp, "train")


@pytest.mark.timeout(HANG_GUARD * 4)
def test_the_same_forced_command_resumes_after_a_stop(exp: Path) -> None:
    model = exp / "train" / "blstm_tiny"
    forced = ["--force", "train", "--to", "train"]
    proc = start(exp, "trainer.epochs=400", *forced)
    wait_for(model / "epoch-3.pt", proc)
    line = stop(proc)
    assert line.endswith("what finished is kept; run the same command to resume"), line
    aside = sorted(p.name for p in (exp / "train").glob("blstm_tiny.before-*"))
    assert len(aside) == 1  # the finished model, moved aside once the forced run started
    plan = run(exp, "trainer.epochs=400", *forced, "--dry-run")
    assert re.search(r"^train\s+runs: forced: resuming the forced run that stopped",
                     plan.stdout, re.M), plan.stdout
    # the same command (fewer epochs: a setting a run may change and still continue)
    again = run(exp, "trainer.epochs=4", *forced)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"resuming after epoch [3-9]", again.stderr), again.stderr[-3000:]
    assert sorted(p.name for p in (exp / "train").glob("blstm_tiny.before-*")) == aside
    assert not list((exp / ".done").glob(".*.forced"))
    # the forced run is over: --force now starts afresh
    time.sleep(1.1)  # the moved-aside dir is named by the second
    fresh = run(exp, "trainer.epochs=1", *forced)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "resuming" not in fresh.stderr
    assert len(list((exp / "train").glob("blstm_tiny.before-*"))) == 2


def test_a_truncated_gmm_model_is_one_line_naming_it(exp: Path) -> None:
    mdl = exp / "align" / "tri1" / "final.mdl"
    cut(mdl)
    # decode_gmm reads the passes' models (its graphs; decode_hybrid reads the last one's graph)
    out = run(exp, "--force", "decode_gmm", "--to", "decode_gmm")
    assert out.returncode == 1, out.stderr[-3000:]
    line = one_error_line(out.stderr)
    assert line.startswith(f"asrtrain: error: {mdl}: not a whole GMM model"), line


def test_the_last_entry_of_every_ark_is_read(tmp_path: Path) -> None:
    """``check_ark_ends``: an ark cut in its last matrix, or before its last entry, or gone, is
    one error naming the table, the entry and the ark's size; a whole one passes."""
    import kaldiio
    import numpy as np

    from asrtrain.train.inputs import check_ark_ends

    ark, scp = tmp_path / "feats.ark", tmp_path / "feats.scp"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as w:
        for i in range(3):
            w(f"utt{i}", np.full((50, 40), i, dtype=np.float32))
    table = dict(line.split(maxsplit=1) for line in scp.read_text().splitlines())
    check_ark_ends(table, scp, "rerun it")
    last = int(table["utt2"].rsplit(":", 1)[1])
    os.truncate(ark, last + 100)
    with pytest.raises(AsrtrainError, match=rf"^{re.escape(str(scp))}: utt2: cannot read "
                       rf"{re.escape(str(ark))}:{last}: the ark ends at byte {last + 100}; "
                       r"cut short or rewritten\? .*; rerun it$"):
        check_ark_ends(table, scp, "rerun it")
    os.truncate(ark, last - 10)
    with pytest.raises(AsrtrainError, match=rf"the ark ends at byte {last - 10}, before the "
                                            "entry; rerun it$"):
        check_ark_ends(table, scp, "rerun it")
    ark.unlink()
    with pytest.raises(AsrtrainError, match=r": utt2: cannot read .*feats\.ark: No such file"):
        check_ark_ends(table, scp, "rerun it")


def test_a_non_finite_number_anywhere_in_a_section_is_named() -> None:
    from omegaconf import OmegaConf

    from asrtrain.train.inputs import check_finite

    check_finite(OmegaConf.create({"layers": 1, "dropout": 0.1, "name": "x"}), "model")
    with pytest.raises(AsrtrainError, match=r"^model\.dropout=nan: expected a finite number$"):
        check_finite(OmegaConf.create({"dropout": math.nan}), "model")
    with pytest.raises(AsrtrainError, match=r"^hybrid\.model\.sizes\[1\]=inf: expected"):
        check_finite({"sizes": [1.0, math.inf]}, "hybrid.model")
