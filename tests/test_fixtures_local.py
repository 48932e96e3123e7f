"""The suite needs nothing outside the repository: its fixtures are in tests/fixtures/."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import OUTSIDE, REPO

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_reading_beside_the_checkout_is_refused():
    # conftest's audit hook: a test that reads the developers' folder fails here too, where the
    # folder exists, not only on a user's machine where it does not.
    with pytest.raises(PermissionError, match="tests/fixtures"):
        open(OUTSIDE / "fixtures" / "glm" / "en20030506.glm")  # noqa: SIM115


def test_fixtures_have_their_provenance():
    for folder in ("sph", "glm"):
        readme = (FIXTURES / folder / "README.md").read_text()
        assert "Provenance and licence" in readme
    assert len(list((FIXTURES / "sph").glob("*.sph"))) == 7
    assert (FIXTURES / "glm" / "en20030506.glm").stat().st_size > 100_000


def test_no_source_names_the_folder_beside_the_checkout():
    needle = "parents[2] / " + '"shared"'
    hits = [str(p.relative_to(REPO)) for top in ("tests", "bench", "asrtrain")
            for p in (REPO / top).rglob("*.py") if needle in p.read_text()]
    assert hits == []
