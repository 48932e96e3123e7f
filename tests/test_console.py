"""A quiet console: a real tiny run through the LM (kaldilm), MFCCs (a process pool), the GMM
passes, their HCLG graphs and decodes prints no Python warning, no library chatter and no progress
bar when stderr is not a terminal; the stage logs keep kaldilm's lines and one line per GMM
iteration; on a terminal the long steps draw their bars.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
from test_e2e import ALIGN_SMALL, REPO, SMALL

from asrtrain import AsrtrainError
from asrtrain.align import align_data
from asrtrain.decode.graph import make_graph
from asrtrain.lang.ngram import arpa2fst
from asrtrain.progress import Bar

# The stages that run kaldilm (lm), a spawn pool (mfcc, nj=2), GMM training with Viterbi
# alignment, HCLG building and GMM decoding (align, one pass, decoded): about a minute.
STAGES = "stages=[prepare,lang,lm,mfcc,align,decode_gmm]"
MONO_DECODED = [o for o in ALIGN_SMALL if "tri1" not in o and not o.startswith("align.decode=")
                ] + ["~align.passes.tri1", "align.decode=true"]
CHATTER = {
    "a Python warning": re.compile(r"\w*Warning\b|warnings\.warn"),
    "kaldilm's C++ log": re.compile(r"\[[IWE]\] |kaldilm/csrc"),
    "resource_tracker": re.compile(r"resource_tracker|leaked semaphore"),
    "a traceback": re.compile(r"Traceback"),
    "a progress bar": re.compile(r"\d+%\|"),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    exp = tmp_path_factory.mktemp("console") / "exp"
    proc = subprocess.run(
        [sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny", f"exp_dir={exp}", STAGES,
         *SMALL, *MONO_DECODED],
        cwd=REPO, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exp, proc


def test_console_has_no_warnings_chatter_or_bars(run) -> None:
    exp, proc = run
    console = proc.stdout + proc.stderr
    for what, pattern in CHATTER.items():
        hits = [ln for ln in console.splitlines() if pattern.search(ln)]
        assert not hits, f"{what} on the console: {hits[:5]}"
    # what the console does show: the stages and the GMM passes' WER lines
    assert "stage align" in proc.stderr
    assert re.search(rf"ran prepare, .*decode_gmm in [\d.]+ s; the experiment is in "
                     rf"{exp.resolve()}$", proc.stderr, re.M)
    assert re.search(r"^eval2000 all: WER \d+\.\d+% .* mono$", proc.stdout, re.M)
    # once: on stdout, not again in the log lines on stderr (the stage's log file keeps it)
    assert "eval2000 all: WER" not in proc.stderr
    assert "eval2000 all: WER" in (exp / "log" / "decode_gmm.log").read_text()


def test_stage_logs_keep_kaldilm_lines_and_every_gmm_iteration(run) -> None:
    exp, _ = run
    lm_log = (exp / "log" / "lm.log").read_text()
    assert "kaldilm: [I] Reading \\data\\ section." in lm_log
    assert "kaldilm: [I] Reading \\3-grams: section." in lm_log
    # not the C++ source line before each message (a build machine's path: issue 27.6)
    assert "csrc" not in lm_log and ".cc:" not in lm_log, lm_log[:2000]
    align_log = (exp / "log" / "align.log").read_text()
    for it in range(1, 5):   # align.passes.mono.num_iters=4
        assert f'mono: {{"iter": {it},' in align_log, it
    assert "graph " in (exp / "log" / "decode_gmm.log").read_text()   # the HCLG sizes


def _on_a_terminal(work) -> str:
    """Run ``work()`` with ``sys.stderr`` a pseudo-terminal (40 x 150: tqdm draws nothing on
    one of size 0); what it wrote there."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    chunks: list[bytes] = []
    drained = threading.Event()   # the reader saw the end marker: nothing is left in the pty

    def drain() -> None:
        while not drained.is_set():
            try:
                chunks.append(os.read(master, 65536))
            except OSError:       # the slave side closed
                return
            if b"<end of work>" in b"".join(chunks[-2:]):
                drained.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    saved = sys.stderr
    sys.stderr = open(slave, "w", buffering=1, closefd=True)
    try:
        work()
    finally:
        print("<end of work>", file=sys.stderr, flush=True)
        drained.wait(timeout=60)  # a hang guard only
        sys.stderr.close()
        sys.stderr = saved
        reader.join(timeout=60)
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_long_steps_draw_bars_on_a_terminal(run, tmp_path: Path) -> None:
    exp, _ = run
    shown = _on_a_terminal(lambda: (
        make_graph(exp / "lang", exp / "lm", exp / "align" / "mono", tmp_path / "graph"),
        align_data(exp / "data" / "train_dev_mfcc", exp / "lang", exp / "align" / "mono",
                   tmp_path / "ali")))
    assert re.search(r"HCLG mono: +\d+%\|", shown), shown[-2000:]
    assert re.search(r"align train_dev_mfcc: +\d+%\|.*utt", shown), shown[-2000:]
    assert (tmp_path / "graph" / "HCLG.fst").is_file() and (tmp_path / "ali" / "ali.scp").is_file()


def _run_on_a_pty(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``asrtrain args`` with stdin, stdout and stderr a pseudo-terminal that nobody sized
    (0 x 0, as script runners and some IDEs make: a plain tqdm draws nothing there), TERM=xterm;
    its exit code and what it showed."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "asrtrain.cli", *args], cwd=REPO,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            env={**os.environ, **env, "TERM": "xterm"})
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:   # EIO: every holder of the slave side has closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=600), b"".join(chunks).decode(errors="replace")


def test_a_real_stage_draws_its_bars_on_an_unsized_terminal(run) -> None:
    exp, _ = run
    rc, shown = _run_on_a_pty(["run", "recipes/tiny", f"exp_dir={exp}", STAGES, *SMALL,
                               *MONO_DECODED, "--stage", "mfcc", "--to", "mfcc", "--force",
                               "mfcc"], {})
    assert rc == 0, shown[-3000:]
    assert "stage mfcc" in shown
    # the job pool's bar and the jobs' bars, redrawn in place
    assert re.search(r"\rmfcc jobs: +\d+%\|[^\r]*job", shown), shown[-3000:]
    assert re.search(r"\d+%\|[^\r]*\d+/\d+ \[[\d:]+<[\d:?]+, +[\d.?]+(utt|job)/s", shown), \
        shown[-3000:]


def test_a_long_step_says_where_it_is_every_interval_with_an_eta(run) -> None:
    # not a terminal: no bar; ASRTRAIN_PROGRESS_EVERY_S=0.1 makes the mfcc stage long (its
    # jobs take ~0.7 s on an idle 2-core machine, and more under load: at 1 s, as first
    # written, an idle machine finished before any heartbeat and the test failed in CI)
    exp, _ = run
    proc = subprocess.run(
        [sys.executable, "-m", "asrtrain.cli", "run", "recipes/tiny", f"exp_dir={exp}", STAGES,
         *SMALL, *MONO_DECODED, "nj=1", "--stage", "mfcc", "--to", "mfcc", "--force", "mfcc"],
        cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        env={**os.environ, "ASRTRAIN_PROGRESS_EVERY_S": "0.1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not re.search(r"\d+%\|", proc.stderr), proc.stderr[-3000:]
    # nj=1: the jobs run here, one after another, each counting its utterances
    beats = re.findall(r"INFO still working: mfcc jobs \d+/\d+ job, \d+:\d\d so far, "
                       r"ETA (?:\d+:\d\d|unknown) › mfcc \(job \d+\) \d+/\d+ utt, \d+:\d\d so "
                       r"far, ETA \d+:\d\d$", proc.stderr, re.M)
    assert beats, proc.stderr[-3000:]


@pytest.mark.parametrize("value", ["soon", "0"])
def test_a_bad_progress_interval_is_said_when_a_step_starts(monkeypatch, value: str) -> None:
    monkeypatch.setenv("ASRTRAIN_PROGRESS_EVERY_S", value)
    with pytest.raises(AsrtrainError, match=rf"ASRTRAIN_PROGRESS_EVERY_S='{value}': expected a "
                                            r"number of seconds"):
        Bar(total=3, desc="align")


def test_a_bad_arpa_is_one_error_line_not_a_dead_process(tmp_path: Path) -> None:
    # kaldilm abort()s on an ARPA without <s>: in a child, that is an error naming the file
    arpa = tmp_path / "bad.arpa"
    arpa.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0 a\n\n\\end\\\n")
    symbols = tmp_path / "words.txt"
    symbols.write_text("<eps> 0\na 1\n#0 2\n")
    with pytest.raises(AsrtrainError, match=r"bad\.arpa: kaldilm arpa2fst failed: .*<s>"):
        arpa2fst(arpa, tmp_path / "G.fst", symbols)
    assert not (tmp_path / "G.fst").exists()
