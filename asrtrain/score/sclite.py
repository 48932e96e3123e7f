"""The "sclite" scoring backend: run NIST SCTK's hubscr.pl itself and read its reports.

hubscr.pl is run as Kaldi's score_sclite.sh runs it (``-V -l english -h hub5 -g GLM -r STM
CTM``), once per subset, in a scratch directory; its ``.sys``, ``.raw``, ``.dtl`` (and the other
sclite reports) are copied to the output directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.fileio import atomic_open
from asrtrain.score.align import Counts

#: Where Debian's sctk package installs the tools; $SCTK_BIN overrides it.
DEFAULT_SCTK_BIN = Path("/usr/lib/sctk/bin")

# hubscr.pl needs a GLM, and rfilter1 crashes on one without any rule: this one maps nothing.
_NULL_GLM = (';; asrtrain: no GLM given\n* format = "NIST1"\n'
             "ASRTRAIN_NO_SUCH_WORD => ASRTRAIN_NO_SUCH_WORD\n")


def sctk_bin() -> Path:
    """The directory holding hubscr.pl and sclite; AsrtrainError if SCTK is not installed."""
    candidates = [Path(os.environ["SCTK_BIN"])] if os.environ.get("SCTK_BIN") else []
    candidates.append(DEFAULT_SCTK_BIN)
    found = shutil.which("hubscr.pl")
    if found:
        candidates.append(Path(found).parent)
    for d in candidates:
        if (d / "hubscr.pl").is_file() and (d / "sclite").is_file():
            return d
    raise AsrtrainError(
        "the sclite backend needs NIST SCTK (hubscr.pl, sclite, csrfilt.sh): install it with "
        "'apt-get install sctk' or set SCTK_BIN to its bin directory, or use --backend python"
    )


_ROW = re.compile(r"^\s*\|\s*(.+?)\s*\|\s*(\d+)\s+(\d+)\s*\|"
                  r"\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|")


def parse_raw(path: Path) -> tuple[dict[str, Counts], Counts]:
    """Read sclite's ``.raw`` report: counts per speaker and the ``Sum`` row."""
    speakers: dict[str, Counts] = {}
    total: Counts | None = None
    for line in Path(path).read_text(encoding="latin-1").splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        name = m.group(1)
        snt, _wrd, corr, sub, dels, ins, _err, serr = (int(m.group(i)) for i in range(2, 10))
        counts = Counts(corr=corr, sub=sub, dels=dels, ins=ins, segments=snt, sent_err=serr)
        if name in ("Sum", "Sum/Avg"):
            total = counts
        else:
            speakers[name] = counts
    if total is None:
        raise AsrtrainError(f"{path}: no 'Sum' row found in sclite's .raw report")
    return speakers, total


def run_hubscr(stm: Path, ctm: Path, glm: Path | None, out_dir: Path, out_name: str,
               timeout: float = 600.0) -> tuple[dict[str, Counts], Counts]:
    """Run hubscr.pl on one STM/CTM pair; reports go to ``out_dir/<out_name>.filt.*``."""
    bindir = sctk_bin()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hubscr.") as tmp:
        work = Path(tmp)
        ref = work / "ref.stm"
        hyp = work / out_name
        shutil.copyfile(stm, ref)
        shutil.copyfile(ctm, hyp)
        if glm is None:
            glm_file = work / "null.glm"
            glm_file.write_text(_NULL_GLM)
        else:
            glm_file = Path(glm).resolve()
        env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        cmd = [str(bindir / "hubscr.pl"), "-p", str(bindir), "-V", "-l", "english", "-h", "hub5",
               "-g", str(glm_file), "-r", ref.name, hyp.name]
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                                  timeout=timeout, errors="replace")
        except subprocess.TimeoutExpired:
            raise AsrtrainError(f"hubscr.pl timed out after {timeout:.0f} s on {ctm}") from None
        raw = work / f"{out_name}.filt.raw"
        output = proc.stdout + proc.stderr
        # sclite's DET-curve report (-C det) segfaults on some inputs after the alignment and the
        # sum/rsum/dtl reports are complete; the counts are still sclite's, so keep them.
        det_crash = (proc.returncode != 0 and raw.is_file()
                     and "SCLITE execution failed" in output
                     and re.search(r"^\s*\| Sum ", raw.read_text(encoding="latin-1"), re.M))
        if (proc.returncode != 0 and not det_crash) or not raw.is_file():
            tail = "\n".join(output.strip().splitlines()[-8:])
            raise AsrtrainError(
                f"hubscr.pl failed (exit {proc.returncode}) scoring {ctm} against {stm}:\n{tail}"
            )
        for f in sorted(work.iterdir()):
            if f.name.startswith(f"{out_name}.filt") and f.is_file():
                with atomic_open(out_dir / f.name, "wb") as out:
                    out.write(f.read_bytes())
        return parse_raw(raw)
