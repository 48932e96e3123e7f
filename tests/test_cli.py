"""The command line itself: help that lists the stages, and help that does not load torch."""

from __future__ import annotations

import subprocess
import sys

from test_e2e import REPO

from asrtrain.stages import STAGES


def test_run_help_lists_every_stage_in_order() -> None:
    out = subprocess.run([sys.executable, "-m", "asrtrain.cli", "run", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    section = out[out.index("Stages, in order"):]
    found = [line.split()[0] for line in section.splitlines()[1:]
             if line.startswith("  ") and not line.startswith("   ")]
    assert found == list(STAGES)


def test_help_does_not_import_torch() -> None:
    # torch takes seconds to import: `asrtrain --help` and `asrtrain run --help` must not wait
    code = ("import sys\nfrom click.testing import CliRunner\nfrom asrtrain.cli import main\n"
            "for args in (['--help'], ['run', '--help'], ['score', '--help']):\n"
            "    assert CliRunner().invoke(main, args).exit_code == 0, args\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip() == "False", out.stderr
