"""Gossip schedules, mixing matrices and spectral gaps against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

from asrtrain import AsrtrainError
from asrtrain.distributed.topology import (
    SCHEMES,
    Schedule,
    second_eigenvalue,
    spectral_gap,
    topology_command,
)


@pytest.mark.parametrize("n", [3, 4, 5, 8, 16, 33, 64])
def test_fixed_ring_closed_form(n: int) -> None:
    lam = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / n)  # lambda_2 of W; E[W^T W] = W^2
    assert spectral_gap(n, "ring") == pytest.approx(1 - lam**2, abs=1e-12)
    w = Schedule(n, "ring").mixing_matrix(0)
    assert second_eigenvalue(w) == pytest.approx(lam, abs=1e-12)


@pytest.mark.parametrize("n", [4, 5, 8, 16, 64])
def test_random_ring_closed_form(n: int) -> None:
    assert spectral_gap(n, "random_ring") == pytest.approx(1 - (1 / 3 - 2 / (3 * (n - 1))),
                                                           abs=1e-12)


def test_random_ring_expectation_matches_sampled_rounds() -> None:
    s = Schedule(6, "random_ring", seed=3)
    sampled = sum(s.mixing_matrix(r).T @ s.mixing_matrix(r) for r in range(4000)) / 4000
    assert np.abs(sampled - s.expected_gram()).max() < 0.02


@pytest.mark.parametrize(("learners", "scheme", "per_node", "gap"), [
    (16, "ring", 1, 0.0989),
    (16, "random_ring", 1, 0.711),
    (64, "ring", 1, 0.0064),
    (64, "random_ring", 1, 0.677),
    (64, "ring", 4, 0.0989),
])
def test_design_reference_values(learners: int, scheme: str, per_node: int, gap: float) -> None:
    assert round(spectral_gap(learners, scheme, per_node), 4) == pytest.approx(gap, abs=5e-4)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 9])
def test_rounds_are_matchings_and_doubly_stochastic(scheme: str, n: int) -> None:
    s = Schedule(n, scheme, seed=1)
    seen = set()
    for r in range(3 * n):
        for phase in s.phases(r):
            members = [i for pair in phase for i in pair]
            assert len(members) == len(set(members))  # a learner has one partner per phase
            seen.update(members)
        w = s.mixing_matrix(r)
        assert np.allclose(w, w.T)
        assert np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1)
        assert (w >= -1e-12).all()
        partners = s.partners(0, r)
        assert len(partners) == len(s.phases(r))
    assert seen == set(range(n))  # nobody is left out for ever (odd counts included)
    assert 0 < spectral_gap(n, scheme) <= 1


def test_ring_rounds_use_both_neighbours_once() -> None:
    s = Schedule(5, "ring")
    edges = sorted(tuple(sorted(p)) for phase in s.phases(0) for p in phase)
    assert edges == [(0, 1), (0, 4), (1, 2), (2, 3), (3, 4)]
    assert s.partners(4, 0) == [None, 3, 0]


def test_bad_configurations_are_errors() -> None:
    with pytest.raises(AsrtrainError, match="per_node"):
        spectral_gap(10, "ring", per_node=4)
    with pytest.raises(AsrtrainError, match="scheme"):
        Schedule(4, "torus")


def test_topology_command_prints_the_gap() -> None:
    result = CliRunner().invoke(topology_command,
                                ["--learners", "64", "--per-node", "4", "--scheme", "ring"])
    assert result.exit_code == 0, result.output
    assert "spectral gap" in result.output and "0.0989" in result.output
    assert "16 nodes x 4" in result.output
    bad = CliRunner().invoke(topology_command, ["--learners", "10", "--per-node", "4"])
    assert bad.exit_code != 0 and "per_node" in bad.output
