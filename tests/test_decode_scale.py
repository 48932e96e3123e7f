"""Hybrid decoding at scale on the tiny corpus: ``nj`` parallel jobs give what one job gives,
``max_active`` caps the FasterDecoder's active states (a small cap still decodes, a large one
equals no cap), and the real-time factor per core is reported in ``decode.json``.

The graph, features and GMM are conftest's session hybrid_setup (test_hybrid_decode's too: a
monophone GMM on eval2000 and its HCLG).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hybrid_decode import FAST, oracle_loglikes, train_blstm

from asrtrain.decode import job_shares
from asrtrain.decode.graph import decode_gmm
from asrtrain.decode.hybrid import decode_hybrid, decode_loglikes, merge_stats

pytestmark = pytest.mark.timeout(600)
NO_CAP = 2**31 - 1


@pytest.fixture(scope="module")
def setup(hybrid_setup: dict[str, Path]) -> dict[str, Path]:
    return hybrid_setup


def _outputs(out: Path) -> tuple[str, str, list]:
    summary = json.loads((out / "decode.json").read_text())
    return (out / "text").read_text(), (out / "ctm").read_text(), summary["sweep"]


def test_parallel_jobs_decode_as_one_job(setup, tmp_path) -> None:
    train_blstm(setup, tmp_path / "final.pt", steps=30)
    options = {**FAST, "beam": 7.0, "lattice_beam": 3.0, "threads": 1, "batch_chunks": 64}
    one = decode_hybrid(tmp_path / "final.pt", setup["graph"], setup["test"], tmp_path / "one",
                        options, nj=1)
    # audio_per_job=0: two jobs however little audio there is
    two = decode_hybrid(tmp_path / "final.pt", setup["graph"], setup["test"], tmp_path / "two",
                        options, nj=2, audio_per_job=0)
    assert (one["jobs"], two["jobs"]) == (1, 2)
    assert _outputs(tmp_path / "one") == _outputs(tmp_path / "two")
    assert (one["utterances"], one["frames"]) == (two["utterances"], two["frames"])
    saved = json.loads((tmp_path / "two" / "decode.json").read_text())
    for summary in (one, two, saved):
        assert summary["real_time_factor_per_core"] > 0 and summary["cpu_seconds"] > 0
        assert summary["wall_real_time_factor"] > 0 and summary["wall_seconds"] > 0
    # little audio and nj=2: one job, as starting a second costs more than it saves
    few = decode_hybrid(tmp_path / "final.pt", setup["graph"], setup["test"], tmp_path / "few",
                        options, nj=2)
    assert few["jobs"] == 1 and _outputs(tmp_path / "few") == _outputs(tmp_path / "one")


def test_a_large_max_active_equals_no_cap_and_a_small_one_decodes(setup, tmp_path) -> None:
    faster = {**FAST, "decoder": "faster"}
    runs = {}
    for cap in (NO_CAP, 7000, 200, 5):
        out = tmp_path / str(cap)
        runs[cap] = decode_loglikes(oracle_loglikes(setup["ali"]), setup["graph"],
                                    setup["gmm_data"], out, {**faster, "max_active": cap})
    assert _outputs(tmp_path / str(NO_CAP)) == _outputs(tmp_path / "7000")
    wer = {cap: r["wer"]["all"]["wer"] for cap, r in runs.items()}
    assert all(r["failed_utterances"] == 0 for r in runs.values())
    assert all((tmp_path / str(cap) / "ctm").read_text().strip() for cap in runs)
    # 200 states a frame keep the oracle path; 5 do decode every utterance, but the cap bites
    assert wer[NO_CAP] < 2.0 and wer[200] < 2.0 < wer[5]


def test_gmm_decoding_in_parallel_jobs_as_in_one(setup, tmp_path) -> None:
    options = {"beam": 11.0, "max_active": 2000}
    one = decode_gmm(setup["ali"], setup["graph"], setup["gmm_data"], tmp_path / "one", options)
    two = decode_gmm(setup["ali"], setup["graph"], setup["gmm_data"], tmp_path / "two", options,
                     nj=2, audio_per_job=0)
    assert (one["jobs"], two["jobs"]) == (1, 2)
    assert one["per_scale"] == two["per_scale"] and one["acoustic_scale"] == two["acoustic_scale"]
    for name in ("text", "ctm"):
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text()
    saved = json.loads((tmp_path / "two" / "decode.json").read_text())
    assert saved["real_time_factor_per_core"] > 0 and saved["cpu_seconds"] > 0


def test_shares_and_merged_stats() -> None:
    utts = [f"u{i}" for i in range(7)]
    assert job_shares(utts, 3) == [utts[0:2], utts[2:5], utts[5:7]]
    assert job_shares(utts, 10) == [[u] for u in utts]
    assert job_shares(utts, 0) == [utts]
    # no more jobs than one per audio_per_job seconds of audio
    assert job_shares(utts, 3, audio_seconds=1300, audio_per_job=600) == [utts[0:4], utts[4:7]]
    assert job_shares(utts, 3, audio_seconds=500, audio_per_job=600) == [utts]
    part = {"utterances": 2, "frames": 300, "audio_seconds": 3.0, "nn_seconds": 0.3,
            "search_seconds": 0.6, "sweep_seconds": 0.1, "cpu_seconds": 1.2,
            "failed_utterances": 0, "untimed_paths": 1}
    merged = merge_stats([part, part])
    assert merged["jobs"] == 2 and merged["frames"] == 600 and merged["untimed_paths"] == 2
    assert merged["real_time_factor"] == pytest.approx(0.3)
    assert merged["real_time_factor_per_core"] == pytest.approx(0.4)
