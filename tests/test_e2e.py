"""End to end: the tiny recipe through every stage with the real CLI, and with each backend."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import forked_cli
import pytest
import small  # bench/small.py (conftest puts bench/ on the path)
import torch
from conftest import copy_exp

REPO = Path(__file__).resolve().parents[1]
# The small settings, one place for the suite and bench/: recipes/tiny/small.yaml (bench/small.py
# reads it). Other test files import these names.
SMALL = small.overrides("ctc")              # the CTC model and trainer, small; nj=2
# mono and tri1 only, the hybrid model on the 40 log-mel input (no fMLLR, no i-vectors)
ALIGN_SMALL = small.overrides("tri1")
# the recipe as shipped, small: tri3 (LDA+MLLT) and tri4 (SAT) from tri1; the 260-dim input
SAT_SMALL = small.overrides("sat")
HYBRID_SMALL = small.overrides("hybrid")

WER_LINE = re.compile(r"^eval2000 (all|swbd|callhm): WER (\d+\.\d+)% \[ (\d+) / (\d+),.*\] (\S+)$",
                      re.M)


def asrtrain(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return forked_cli.run(*args, timeout=timeout, check=True)


@pytest.fixture(scope="module")
def exp(tiny_shipped: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's run of every stage (conftest's tiny_shipped), which the tests of
    this module add to (more models, other backends)."""
    return copy_exp(tiny_shipped["exp"], tmp_path_factory.mktemp("tiny") / "exp")


def test_tiny_recipe_every_stage_then_nothing(tiny_shipped: dict, tmp_path: Path) -> None:
    """The session's run of the recipe from the raw corpus (conftest's tiny_shipped, these
    settings: SMALL, SAT_SMALL, HYBRID_SMALL), then the same command again, on a copy."""
    assert tiny_shipped["args"] == ["recipes/tiny", *SMALL, *SAT_SMALL, *HYBRID_SMALL]
    out = subprocess.CompletedProcess(tiny_shipped["args"], 0, tiny_shipped["stdout"],
                                      tiny_shipped["stderr"])
    exp = tiny_shipped["exp"]
    wers = {(m.group(5), m.group(1)): (float(m.group(2)), int(m.group(4)))
            for m in WER_LINE.finditer(out.stdout)}
    # both systems' WERs are printed: the CTC model's, then the hybrid's
    assert set(wers) == {(system, subset) for system in ("blstm_tiny", "hybrid_tiny")
                         for subset in ("all", "swbd", "callhm")}
    for system in ("blstm_tiny", "hybrid_tiny"):
        assert wers[system, "all"][1] == wers[system, "swbd"][1] + wers[system, "callhm"][1] > 0
    for stage in ("prepare", "lang", "features", "train", "decode", "score", "lm", "mfcc",
                  "align", "fmllr", "decode_gmm", "ivectors", "train_hybrid", "decode_hybrid"):
        assert (exp / ".done" / stage).is_file()
        assert f"stage {stage}" in out.stderr
    assert (exp / "decode" / "blstm_tiny" / "eval2000" / "score" / "ctm.filt.sys").is_file()
    assert (exp / "decode" / "hybrid_tiny" / "eval2000" / "decode.json").is_file()
    again = asrtrain("run", "recipes/tiny", f"exp_dir={copy_exp(exp, tmp_path / 'exp')}",
                     *SMALL, *SAT_SMALL, *HYBRID_SMALL)
    assert "nothing to do" in again.stderr and "starts" not in again.stderr


@pytest.mark.parametrize("backend, extra", [
    ("ssgd", []), ("adpsgd", ["trainer.topology=random_ring"]),
    ("hadpsgd", ["trainer.per_node=2"])])
def test_tiny_recipe_trains_with_four_learners(exp: Path, backend: str, extra: list[str]) -> None:
    if not (exp / ".done" / "features").is_file():
        asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--to", "features", *SMALL)
    name = f"blstm_{backend}"
    out = asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--stage", "train", "--to", "score",
                   *SMALL,
                   f"model.name={name}", f"trainer.backend={backend}", "trainer.learners=4",
                   *extra)
    log = (exp / "log" / "train.log").read_text()
    assert f"backend {backend}" in log
    if backend != "ssgd":
        assert "spectral gap" in log
    final = torch.load(exp / "train" / name / "final.pt", map_location="cpu",
                       weights_only=False)
    assert final["epoch"] == 1 and final["metrics"]["global_samples"] > 0
    # the epoch's drain, where learners gossip (hadpsgd's 2 nodes; adpsgd's 4 members)
    drain = {k: v for k, v in final["metrics"].items() if k.startswith("gossip_")}
    if backend == "ssgd":
        assert drain == {}
    else:
        assert set(drain) == {"gossip_hold_s", "gossip_rounds", "gossip_drain_s"}, drain
        assert drain["gossip_hold_s"] >= 0 and drain["gossip_rounds"] >= 1, drain
        assert "gossip_hold_s" in log  # the epoch's log line
    assert len(WER_LINE.findall(out.stdout)) == 3
    # the learners' console is quiet too: no runpy warning of a warm start, no "leaked
    # semaphore" from a learner's resource tracker (tqdm's lock was a multiprocessing one)
    chatter = [ln for ln in (out.stdout + out.stderr).splitlines()
               if re.search(r"\w*Warning\b|leaked semaphore|resource_tracker", ln)]
    assert not chatter, chatter[:4]


def test_bad_corpus_path_is_one_clear_error(tmp_path: Path) -> None:
    proc = forked_cli.run("run", "recipes/tiny", f"exp_dir={tmp_path / 'exp'}",
                          f"corpus.root={tmp_path / 'nowhere'}", timeout=120)
    assert proc.returncode == 1
    assert f"asrtrain: error: {tmp_path / 'nowhere'}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "exp" / ".done" / "prepare").exists()


@pytest.fixture(scope="module")
def aligned(exp: Path) -> Path:
    if not (exp / ".done" / "features").is_file():
        asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--to", "features", *SMALL)
    asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--stage", "lm", "--to", "ivectors",
             *SMALL, *SAT_SMALL)
    return exp


@pytest.mark.parametrize("backend, extra", [
    ("ssgd", []), ("adpsgd", ["trainer.delay_by_one=true"]),
    ("hadpsgd", ["trainer.per_node=2"])])
def test_hybrid_with_four_learners_decodes_through_hclg(aligned: Path, backend: str,
                                                         extra: list[str]) -> None:
    exp = aligned
    name = f"hybrid_{backend}"
    out = asrtrain("run", "recipes/tiny", f"exp_dir={exp}", "--stage", "train_hybrid",
                   *SMALL, *SAT_SMALL, *HYBRID_SMALL, f"hybrid.model.name={name}",
                   f"trainer.backend={backend}", "trainer.learners=4", *extra)
    final = torch.load(exp / "train" / name / "final.pt", map_location="cpu",
                       weights_only=False)
    num_pdfs = int((exp / "align" / "tri4" / "num_pdfs").read_text().split()[0])
    assert final["output_dim"] == num_pdfs == final["log_priors"].numel()
    assert final["input_dim"] == 260    # fbank + deltas | fMLLR | i-vector
    assert 0 < final["metrics"]["dev_frame_accuracy"] <= 100
    decoded = exp / "decode" / name / "eval2000"
    assert (decoded / "ctm").stat().st_size > 0
    assert "stage decode_hybrid" in out.stderr
