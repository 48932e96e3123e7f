"""How fast each simulated learner computes: the per-step times of a speed model.

``equal`` (every learner ``step_s`` per step), ``hetero[:SIGMA]`` (each learner's own speed, a
log-normal factor of spread SIGMA, default 0.3, drawn once per run) and
``straggler[:COUNT[:FACTOR]]`` (COUNT learners, default 1, chosen by the seed, FACTOR times
slower, default 4). ``jitter`` adds a
uniform per-step variation of ±jitter of the step's time. Everything is drawn from the run's seed,
so a simulation is reproducible.
"""

from __future__ import annotations

import numpy as np

from asrtrain import AsrtrainError

KINDS = ("equal", "hetero", "straggler")


def learner_factors(spec: str, learners: int, seed: int) -> np.ndarray:
    """Each learner's step-time factor (1.0: nominal) under the speed model ``spec``."""
    kind, *args = spec.split(":")
    try:
        values = [float(a) for a in args]
    except ValueError:
        raise AsrtrainError(f"simulate --speed {spec!r}: expected {_usage()}") from None
    rng = np.random.default_rng([seed, 7])
    if kind == "equal" and not values:
        return np.ones(learners)
    if kind == "hetero" and len(values) <= 1:
        sigma = values[0] if values else 0.3
        return np.exp(rng.normal(0.0, sigma, learners))
    if kind == "straggler" and len(values) <= 2:
        count = int(values[0]) if values else 1
        factor = values[1] if len(values) > 1 else 4.0
        if not 0 <= count <= learners or factor <= 0:
            raise AsrtrainError(f"simulate --speed {spec!r}: COUNT must be 0..{learners} and "
                                "FACTOR positive")
        out = np.ones(learners)
        out[rng.choice(learners, size=count, replace=False)] = factor
        return out
    raise AsrtrainError(f"simulate --speed {spec!r}: expected {_usage()}")


def _usage() -> str:
    return "equal, hetero[:SIGMA] or straggler[:COUNT[:FACTOR]]"


def step_times(factors: np.ndarray, steps: int, step_s: float, jitter: float, seed: int,
               epoch: int) -> np.ndarray:
    """Seconds of each step of each learner in ``epoch``: [learners, steps]."""
    base = np.outer(factors, np.full(steps, step_s))
    if jitter:
        rng = np.random.default_rng([seed, 11, epoch])
        base *= 1.0 + rng.uniform(-jitter, jitter, base.shape)
    return base
