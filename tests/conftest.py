"""Shared fixtures: small real data dirs with real WAV audio, written per test; the device.

Device: the suite runs on the CPU, also on a machine with a GPU. Unless ``ASRTRAIN_TEST_DEVICE``
is ``cuda``, this file hides the GPUs (``CUDA_VISIBLE_DEVICES=''``) before anything imports
torch, so every test, every trainer it runs in-process and every learner or CLI process it starts
sees no CUDA and trains on the CPU: the same results on every machine, and no CUDA state (driver,
autograd's device threads) in the pytest process that a fork could copy. Tests that need a GPU
are marked ``@pytest.mark.cuda`` and take the ``device`` fixture; they run only in a session of
their own, ``ASRTRAIN_TEST_DEVICE=cuda pytest -m cuda`` (a CUDA session runs no other test), and
are skipped, with the reason, elsewhere.

Workers: ``make test`` runs the suite in 2 pytest-xdist worker processes (``TEST_WORKERS=N``:
``-n N``; ``--dist loadfile``: each file whole in one worker, the slowest files first,
:data:`SLOW_FIRST`). The tiny recipe's session experiments, ``hybrid_setup`` and
``user_corpus`` are built once for all the workers (:func:`_once`: the first worker to ask
builds under a file lock, the others wait and read the same folders); the espeak corpus and its
passes once in each worker that uses them.
They are read-only in every test; a test that changes one works on a copy (:func:`copy_exp`).

Commands: a test that runs ``python -m asrtrain.cli`` for its contract calls
``forked_cli.run`` (bench/forked_cli.py: a process of its own, forked warm from a fork server);
tests that signal a run or read it while it runs start real processes with :mod:`subprocess`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

# bench/ on the path: bench/small.py (the small settings), bench/forked_cli.py (warm commands),
# bench/synthetic.py (the synthetic learner of the distributed tests and the benchmarks)
if str(Path(__file__).resolve().parents[1] / "bench") not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import forked_cli  # noqa: E402  (bench/forked_cli.py)

#: ``cpu`` (the default: GPUs hidden) or ``cuda`` (only the tests marked ``cuda`` run).
TEST_DEVICE = os.environ.get("ASRTRAIN_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_initialized():
            raise RuntimeError("tests/conftest.py: CUDA was initialised before the CPU pin")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

REPO = Path(__file__).resolve().parents[1]
#: The developers' folder beside a checkout (design notes, fixture originals). A user's clone has
#: none, so no test may read it: every fixture a test reads is in tests/fixtures/, with its
#: provenance. The audit hook below makes a read there an error in every test of this process,
#: so CI, which has the folder beside its clone, proves the suite does not need it.
OUTSIDE = REPO.parent / "shared"


def _no_reads_outside(event: str, args: tuple) -> None:
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.startswith(str(OUTSIDE) + os.sep) or os.path.abspath(path).startswith(
                str(OUTSIDE) + os.sep):
            raise PermissionError(f"{path}: tests must not read {OUTSIDE} (a user's clone has "
                                  "no such folder): copy the file into tests/fixtures/ with its "
                                  "provenance")


sys.addaudithook(_no_reads_outside)


def write_datadir(root: Path, n_speakers: int = 2, utts_per_speaker: int = 3,
                  sample_rate: int = 8000, seed: int = 0) -> Path:
    """A Kaldi data dir of one WAV file per utterance (tones and noise), with text."""
    rng = np.random.default_rng(seed)
    words = ["hello", "world", "yes", "no", "maybe", "sure", "right", "okay"]
    d = root / "data"
    (root / "wav").mkdir(parents=True, exist_ok=True)
    d.mkdir(parents=True, exist_ok=True)
    wav, text, utt2spk = [], [], []
    for s in range(n_speakers):
        spk = f"spk{s}"
        for u in range(utts_per_speaker):
            utt = f"{spk}-utt{u}"
            n = int(sample_rate * (0.6 + 0.4 * rng.random()))
            t = np.arange(n) / sample_rate
            tone = np.sin(2 * np.pi * (200 + 100 * s + 50 * u) * t)
            x = 3000 * tone + 300 * rng.standard_normal(n)
            path = root / "wav" / f"{utt}.wav"
            soundfile.write(path, x.astype(np.int16), sample_rate, subtype="PCM_16")
            wav.append(f"{utt} {path}")
            text.append(f"{utt} " + " ".join(rng.choice(words, size=3)))
            utt2spk.append(f"{utt} {spk}")
    (d / "wav.scp").write_text("\n".join(sorted(wav)) + "\n")
    (d / "text").write_text("\n".join(sorted(text)) + "\n")
    (d / "utt2spk").write_text("\n".join(sorted(utt2spk)) + "\n")
    spk2utt = {}
    for line in sorted(utt2spk):
        u, s = line.split()
        spk2utt.setdefault(s, []).append(u)
    (d / "spk2utt").write_text("".join(f"{s} {' '.join(us)}\n" for s, us in spk2utt.items()))
    return d


@pytest.fixture
def datadir(tmp_path: Path) -> Path:
    return write_datadir(tmp_path)


def pytest_configure(config: pytest.Config) -> None:
    if TEST_DEVICE not in ("cpu", "cuda"):
        raise pytest.UsageError(f"ASRTRAIN_TEST_DEVICE={TEST_DEVICE!r}: use cpu or cuda")
    # pytest-xdist hands out whole files with the most tests first unless told not to, which
    # left the longest single-test files for last: the order of SLOW_FIRST below is the one kept
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    config.addinivalue_line(
        "markers", "cuda: needs a GPU; runs only with ASRTRAIN_TEST_DEVICE=cuda (pytest -m cuda)")


def _gpus() -> int:
    """GPUs torch sees (NVML first: the count does not mark the process against forking)."""
    import torch

    return torch.cuda.device_count()


#: The test files that take longest, run first, in this order (``make test`` hands whole files to
#: its 2 pytest-xdist workers in collection order, ``--dist loadfile``, each worker holding its
#: current file and the next): a long file started last would keep one worker busy while the
#: other has finished, and two files that need the same session experiment at once would leave
#: one worker waiting while the other builds it. So the first two build the two big ones side by
#: side (tiny_shipped for test_align_sat_stage, tiny_tri1 for test_multinode), the next two need
#: neither build, and the files after them find both built. Seconds each from a fresh clone's
#: ``--durations=0`` (ci18, at 710c7b4, on 2 idle cores): 146, 195, 138, 117, 88, 100, 57, 61,
#: 68, 62, 59, 53, 46, 40, 29, 27, 26. A file not listed keeps its place after them.
SLOW_FIRST = ("test_align_sat_stage", "test_multinode", "test_bench_scale", "test_faults",
              "test_e2e", "test_bench_science", "test_align_reproducible", "test_slurm",
              "test_simulate", "test_straggler", "test_align_adapt", "test_ivectors_stage",
              "test_report", "test_console", "test_pass_subsets", "test_transcribe",
              "test_train_guards")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: k for k, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(SLOW_FIRST)))  # stable
    if TEST_DEVICE == "cpu":
        skip = pytest.mark.skip(reason="needs a GPU: the suite pins the CPU; run "
                                "ASRTRAIN_TEST_DEVICE=cuda pytest -m cuda")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
        return
    gpus = _gpus() if any("cuda" in item.keywords for item in items) else 0
    for item in items:
        if "cuda" not in item.keywords:
            item.add_marker(pytest.mark.skip(
                reason="ASRTRAIN_TEST_DEVICE=cuda runs only the tests marked cuda; the others "
                       "run in the default (CPU-pinned) session"))
        elif gpus == 0:
            item.add_marker(pytest.mark.skip(
                reason="ASRTRAIN_TEST_DEVICE=cuda but torch sees no CUDA device"))


@pytest.fixture
def device(request: pytest.FixtureRequest):
    """The device of this test: ``cuda`` for a test marked cuda, else the CPU."""
    import torch

    return torch.device("cuda" if "cuda" in request.keywords else "cpu")


@pytest.fixture
def one_thread():
    """This test's in-process torch and BLAS work in one thread each, as a stage's process does
    it (``threads: 1``; bench/science.py's main sets the same), the caller's counts restored
    after. torch's default, a thread per core, costs far more than it gives on tiny inputs
    while the suite's other worker keeps the cores busy: OpenMP threads waiting on each other
    (the tri4 first-pass decode of test_align_sat_stage: 17.5 s with 2 threads, 2.1 s with 1;
    three simulated points of test_bench_science: 13.5 s and 5.7 s, on 2 cores at load ~4)."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            yield
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------ built once for the whole session
def _once(factory: pytest.TempPathFactory, name: str, build, own: bool = False):
    """``build()``'s result, built by one pytest process of the session and read by the others.

    Under pytest-xdist (``make test`` runs the suite in several worker processes) each worker
    has a session of its own, so a session fixture would be built once per worker: the workers
    share the run's temporary folder instead, and the first to ask builds under a lock
    (``<name>.lock``) and records the result (``<name>.pickle``, paths and strings) for the
    others, which wait for it. A build that fails records its error, so the other workers fail
    at once with it instead of building again. Without xdist the lock has no one to wait for.
    ``own``: built once in each worker instead, in its own folder (the espeak corpus and its
    passes: their tests ran with a shared copy written by another worker's jobs at the same
    time, and test_align_adapt's fMLLR equivariance test failed once that way)."""
    import fcntl
    import pickle

    shared = _shared_root(factory, own)
    record = shared / f"{name}.pickle"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.is_file():
            result = pickle.loads(record.read_bytes())
            if isinstance(result, _FailedBuild):
                pytest.fail(f"session fixture {name} failed in another worker:\n{result.why}")
            return result
        try:
            result = build()
        except BaseException as e:
            record.write_bytes(pickle.dumps(_FailedBuild(f"{type(e).__name__}: {e}"[-4000:])))
            raise
        record.write_bytes(pickle.dumps(result))
        return result


class _FailedBuild:
    def __init__(self, why: str) -> None:
        self.why = why


def _shared_root(factory: pytest.TempPathFactory, own: bool = False) -> Path:
    """The session's temporary folder that every xdist worker sees (the workers' own are
    ``popen-gw<N>`` under it); the basetemp itself without xdist, or with ``own``."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") and not own else base


def shared_dir(factory: pytest.TempPathFactory, name: str, own: bool = False) -> Path:
    """A new folder ``name`` in the session's shared temporary folder (see :func:`_once`); a
    half-built one of an earlier try is removed first."""
    import shutil

    path = _shared_root(factory, own) / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir()
    return path


# The espeak-ng corpus and its GMM passes, built once a session (they were built once for each
# module that imported test_align's fixtures): test_align, test_align_adapt, test_align_scale and
# test_align_jobs_stream read them. The helpers and pass settings stay in the test modules that
# test them (test_align: speak, make_dict, MONO, TRI; test_align_adapt: TRI3, TRI4). A test that
# changes a pass's files works on a copy (shutil.copytree(..., symlinks=True)).
def _one_thread() -> None:
    """Each pass is trained with one torch thread, as when each module built its own passes
    right after the corpus (a test run before may have left more; the float sums, and so the
    passes' models, depend on it), and one BLAS thread (numpy's LDA, MLLT and fMLLR solves:
    a test run before in the same process may have set its pools otherwise)."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """4 espeak-ng voices as 4 speakers: 48 training and 16 test utterances, MFCC, a lang dir."""
    import random

    from test_align import make_dict, speak

    from asrtrain.lang.lexicon import prepare_lang

    def build() -> dict[str, Path]:
        _one_thread()
        root = shared_dir(tmp_path_factory, "espeak", own=True)
        rng = random.Random(7)
        out = {"train": speak(root, "train", 48, rng), "test": speak(root, "test", 16, rng),
               "root": root}
        prepare_lang(make_dict(root), root / "lang")
        out["lang"] = root / "lang"
        return out
    return _once(tmp_path_factory, "espeak", build, own=True)


def _espeak_pass(factory: pytest.TempPathFactory, corpus: dict[str, Path], name: str,
                 make) -> Path:
    """``corpus["root"]/exp/<name>``, made once in this worker by ``make(out)``, one thread."""
    def build() -> Path:
        _one_thread()
        out = corpus["root"] / "exp" / name
        make(out)
        return out
    return _once(factory, name, build, own=True)


@pytest.fixture(scope="session")
def mono(corpus: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_align import MONO

    from asrtrain.align.train import train_mono

    return _espeak_pass(tmp_path_factory, corpus, "mono", lambda out: train_mono(
        corpus["train"], corpus["lang"], out, MONO))


@pytest.fixture(scope="session")
def mono_ali(corpus: dict[str, Path], mono: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    from asrtrain.align import align_data

    return _espeak_pass(tmp_path_factory, corpus, "mono_ali", lambda out: align_data(
        corpus["train"], corpus["lang"], mono, out))


@pytest.fixture(scope="session")
def tri1(corpus: dict[str, Path], mono_ali: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_align import TRI

    from asrtrain.align.train import train_tri

    return _espeak_pass(tmp_path_factory, corpus, "tri1", lambda out: train_tri(
        corpus["train"], corpus["lang"], mono_ali, out, TRI))


def _train_pass(factory: pytest.TempPathFactory, corpus: dict[str, Path], source: Path,
                name: str, options) -> Path:
    """The espeak corpus's pass ``name`` trained from ``source``'s alignments, one thread."""
    from asrtrain.align import train_pass

    return _espeak_pass(factory, corpus, name, lambda out: train_pass(
        corpus["train"], corpus["lang"], source, out, options))


@pytest.fixture(scope="session")
def tri3(corpus: dict[str, Path], tri1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LDA+MLLT from tri1 (test_align_adapt's TRI3)."""
    from test_align_adapt import TRI3

    return _train_pass(tmp_path_factory, corpus, tri1, "tri3", TRI3)


@pytest.fixture(scope="session")
def tri4(corpus: dict[str, Path], tri3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SAT from tri3 (test_align_adapt's TRI4)."""
    from test_align_adapt import TRI4

    return _train_pass(tmp_path_factory, corpus, tri3, "tri4", TRI4)


# -------------------------------------------------------------- experiments of the tiny recipe
#: The data stages and the GMM passes of the tiny recipe (no training stage, no decoding).
GMM_STAGES = "stages=[prepare,lang,features,lm,mfcc,align]"


@pytest.fixture(scope="session")
def tiny_tri1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny recipe's data stages and its small GMM passes (mono and tri1 of
    recipes/tiny/small.yaml's tri1 set, nj=2): prepare, lang, features, lm, mfcc, align, run
    once a session through the CLI. Read-only: a test that adds to it or changes it copies it
    first (``shutil.copytree(tiny_tri1, dest, symlinks=True)``: a moved exp dir is rewritten to
    its new place on its next run)."""

    import small  # bench/small.py

    def build() -> Path:
        exp = shared_dir(tmp_path_factory, "tiny_tri1") / "exp"
        proc = forked_cli.run("run", "recipes/tiny", f"exp_dir={exp}", GMM_STAGES,
                              *small.overrides("tri1"), "nj=2", timeout=1800)
        assert proc.returncode == 0, proc.stderr[-4000:]
        # beside the exp dir, not in it (copies leave it behind): what the GMM passes printed
        (exp.parent / "run.stderr").write_text(proc.stderr)
        return exp
    return _once(tmp_path_factory, "tiny_tri1", build)


#: The tiny recipe's two systems, small: the CTC model, mono and tri1, the hybrid model on the 40
#: log-mel input (recipes/tiny/small.yaml's ctc, tri1 and hybrid sets; tests/test_e2e.py's SMALL,
#: ALIGN_SMALL and HYBRID_SMALL, in that order).
TRAINED_SETS = ("ctc", "tri1", "hybrid")


def copy_exp(exp: Path, dest: Path) -> Path:
    """A copy of a session experiment that a test may change (``dest``, which must not exist):
    symlinks kept; the copy's next run rewrites the records that name the old place."""
    import shutil

    shutil.copytree(exp, dest, symlinks=True)
    return dest


@pytest.fixture(scope="session")
def tiny_trained(tiny_tri1: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every stage of the tiny recipe, small (TRAINED_SETS), run once a session through the
    CLI on a copy of ``tiny_tri1``, whose data stages and GMM passes it reuses: both models
    trained, decoded and scored. ``{"exp": the exp dir, "args": the run's arguments after
    ``run``, less ``exp_dir``, "stderr": its output, "gmm_stderr": tiny_tri1's run's, the data
    stages' and GMM passes'}``. Read-only: a test that runs anything in
    it works on a copy (``copy_exp``), and passes the same ``args`` to find nothing to do."""

    import small  # bench/small.py

    def build() -> dict:
        exp = copy_exp(tiny_tri1, shared_dir(tmp_path_factory, "tiny_trained") / "exp")
        args = ["recipes/tiny", *small.overrides(*TRAINED_SETS)]
        proc = forked_cli.run("run", *args, f"exp_dir={exp}", timeout=1800)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return {"exp": exp, "args": args, "stderr": proc.stderr,
                "gmm_stderr": (tiny_tri1.parent / "run.stderr").read_text()}
    return _once(tmp_path_factory, "tiny_trained", build)


#: The tiny recipe as shipped, small: the CTC model, the SAT chain (mono, tri1, tri3, tri4), the
#: i-vectors and the hybrid model on the 260-dim input (recipes/tiny/small.yaml's ctc, sat and
#: hybrid sets; tests/test_e2e.py's SMALL, SAT_SMALL and HYBRID_SMALL, in that order).
SHIPPED_SETS = ("ctc", "sat", "hybrid")


@pytest.fixture(scope="session")
def tiny_shipped(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every stage of the tiny recipe as shipped (SHIPPED_SETS), run once a session from the raw
    corpus through the CLI, with ``PYTHONHASHSEED=1``: test_e2e checks the run and what it
    printed, test_align_reproducible compares its GMM passes and fMLLR features with a second
    run from scratch (another hash seed). ``{"exp": the exp dir, "args": the run's arguments
    after ``run``, less ``exp_dir``, "stdout", "stderr"}``. Read-only: a test that runs anything
    in it works on a copy (``copy_exp``)."""
    import subprocess

    import small  # bench/small.py

    def build() -> dict:
        exp = shared_dir(tmp_path_factory, "tiny_shipped") / "exp"
        args = ["recipes/tiny", *small.overrides(*SHIPPED_SETS)]
        # a process of its own, not forked_cli's: a forked one keeps its fork server's hash seed
        proc = subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", *args,
                               f"exp_dir={exp}"], cwd=REPO, capture_output=True, text=True,
                              timeout=1800, env={**os.environ, "PYTHONUNBUFFERED": "1",
                                                 "PYTHONHASHSEED": "1"})
        assert proc.returncode == 0, proc.stderr[-4000:]
        return {"exp": exp, "args": args, "stdout": proc.stdout, "stderr": proc.stderr}
    return _once(tmp_path_factory, "tiny_shipped", build)


@pytest.fixture(scope="session")
def hybrid_setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny corpus's eval2000 (espeak-ng speech, stm + glm) with MFCC (for the GMM) and fbank
    (for the BLSTM) features, a monophone GMM trained on eval2000 itself (test_hybrid_decode's
    MONO; its text in the lexicon's case, out-of-vocabulary words as <unk>) and its HCLG: built
    once a session for test_hybrid_decode and test_decode_scale (each had a module's copy)."""
    return _once(tmp_path_factory, "hybrid",
                 lambda: _hybrid_setup(shared_dir(tmp_path_factory, "hybrid")))


def _hybrid_setup(root: Path) -> dict[str, Path]:
    import shutil

    from test_hybrid_decode import MONO

    from asrtrain.align.train import train_mono
    from asrtrain.data.corpora import prepare_corpus
    from asrtrain.data.datadir import DataDir
    from asrtrain.decode.graph import make_graph
    from asrtrain.features.extract import FeatureOptions, compute_features
    from asrtrain.lang.lexicon import prepare_lang
    from asrtrain.lang.ngram import train_lm
    from asrtrain.lang.phones import SymbolTable

    _one_thread()
    data = root / "exp" / "data"
    prepare_corpus({"kind": "tiny", "root": str(REPO / "data" / "tiny"), "dev_utts": 40,
                    "max_dup": 4, "expected_test_sides": 12}, data)
    test, gmm_data = data / "eval2000", root / "eval2000_mfcc"
    shutil.copytree(test, gmm_data)
    (gmm_data / "stm").unlink()
    prepare_lang(data / "local" / "dict", root / "lang")
    # the lexicon's case, out-of-vocabulary words (hesitations, partial words) as <unk>
    vocab = set(SymbolTable.read(root / "lang" / "words.txt").id2sym)
    d = DataDir.read(test)
    (gmm_data / "text").write_text("".join(
        f"{u} {' '.join(w if w in vocab else '<unk>' for w in d.text[u].lower().split())}\n"
        for u in d.utts))
    compute_features(gmm_data, root / "mfcc", FeatureOptions(kind="mfcc", num_mel_bins=23), nj=1)
    compute_features(test, root / "fbank", FeatureOptions(kind="fbank", num_mel_bins=40), nj=1)
    texts = [t for s in (data / "train", gmm_data) for t in DataDir.read(s).text.values()]
    train_lm(texts, root / "lang", root / "lm", order=3)
    train_mono(gmm_data, root / "lang", root / "ali" / "eval2000", MONO)
    make_graph(root / "lang", root / "lm", root / "ali" / "eval2000", root / "graph")
    return {"root": root, "test": test, "gmm_data": gmm_data, "ali": root / "ali" / "eval2000",
            "graph": root / "graph"}


@pytest.fixture(scope="session")
def user_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train (10 speakers of the tiny train_nodup and one 0.12 s utterance), dev (the tiny
    train_dev), test (4 other speakers, scored by plain WER), and lex.txt: the tiny dict's
    lexicon as plain 'WORD PHONE ...' lines, without its silence entries and without REMOVED:
    your own data dirs for recipes/datadir (test_datadir_recipe and test_content_digest, which
    imported the module's fixture), built once a session; read-only."""
    return _once(tmp_path_factory, "mine", lambda: _user_corpus(shared_dir(tmp_path_factory,
                                                                           "mine")))


def _user_corpus(root: Path) -> Path:
    import re

    from test_datadir_recipe import REMOVED, SHORT_UTT

    from asrtrain.data.corpora import prepare_corpus
    from asrtrain.data.datadir import DataDir, Segment

    prepare_corpus({"kind": "tiny", "root": str(REPO / "data" / "tiny"), "dev_utts": 40,
                    "max_dup": 4, "expected_test_sides": 12}, root / "tiny")
    nodup = DataDir.read(root / "tiny" / "train_nodup")
    speakers = list(nodup.spk2utt)
    train = nodup.subset([u for s in speakers[:10] for u in nodup.spk2utt[s]])
    train.text[SHORT_UTT] = "i used to go camping when i was a kid"
    train.utt2spk[SHORT_UTT] = "sw02006-A"
    train.segments[SHORT_UTT] = Segment("sw02006-A", 0.0, 0.12)
    train.write(root / "train")
    nodup.subset([u for s in speakers[-4:] for u in nodup.spk2utt[s]]).write(root / "test")
    DataDir.read(root / "tiny" / "train_dev").write(root / "dev")
    lexicon = (root / "tiny" / "local" / "dict" / "lexicon.txt").read_text().splitlines()
    (root / "lex.txt").write_text("".join(
        f"{line}\n" for line in lexicon
        if line.split()[0] not in REMOVED and not re.match(r"^(!sil|<unk>|\[)", line)))
    return root
