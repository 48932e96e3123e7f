"""Gossip topologies: which learners average with which in each round, their mixing matrices and
spectral gaps (Zhang, Cui, Kingsbury et al., ICASSP 2020 and IEEE/ACM TASLP 2021).

A round of gossip is a list of *phases*; each phase is a matching (disjoint pairs), so in a phase a
learner talks to at most one neighbour and every pair is an active/passive couple of a bipartite
graph. All learners walk through (round, phase) in the same order, so a learner only ever waits
for a partner that is at the same (round, phase) or will reach it: waits form no cycle, and the
schedule cannot deadlock for any number of learners (an odd ring gets a third phase for its odd
edge). Every pair exchanges the models both had at the start of the round and each side adds
``w * (x_partner - x_own)``, so a round applies the doubly stochastic mixing matrix

    W_r = I - w * sum_{(i, j) in round r} (e_i - e_j)(e_i - e_j)^T,

with ``w = 1/3`` on rings (``x_i <- (x_{i-1} + x_i + x_{i+1}) / 3``) and ``w = 1/2`` (exact
pairwise averaging) on two learners and on the bipartite exponential graph. The expected squared
distance to consensus shrinks per round by at most ``lambda_2(E[W^T W])``; the spectral gap is
``1 - lambda_2(E[W^T W])``.

Schemes: ``ring`` (fixed ring), ``random_ring`` (a fresh ring from a permutation drawn from a
shared seed each round) and ``exponential`` (bipartite exponential graph: even learners pair with
the odd learner at offset ``2^k - 1``, ``k`` cycling with the round). With ``per_node`` learners
per node (H-AD-PSGD) a node averages exactly inside itself, ``W = W_nodes (x) J/per_node``.
"""

from __future__ import annotations

import math

import click
import numpy as np

from asrtrain import AsrtrainError

SCHEMES = ("ring", "random_ring", "exponential")

Pair = tuple[int, int]


def _ring_phases(order: list[int]) -> list[list[Pair]]:
    """Colour the edges of the ring visiting ``order`` into matchings (2 phases, 3 if odd)."""
    n = len(order)
    if n < 2:
        return []
    if n == 2:
        return [[(order[0], order[1])]]
    edges = [(order[p], order[(p + 1) % n]) for p in range(n)]
    phases: list[list[Pair]] = [edges[0 : n - n % 2 : 2], edges[1 : n - n % 2 : 2]]
    if n % 2:
        # An odd cycle is not bipartite: its closing edge gets a phase of its own.
        phases[1] = edges[1 : n - 1 : 2]
        phases.append([edges[n - 1]])
    return phases


def _exponential_offsets(n: int) -> list[int]:
    """Odd offsets 1, 3, 7, 15, ... (2^k - 1) below n: even learners meet odd ones only."""
    offsets = []
    k = 1
    while (1 << k) - 1 < n:
        offsets.append((1 << k) - 1)
        k += 1
    return offsets or [1]


class Schedule:
    """The gossip schedule of ``n`` learners: the matchings of every round, shared by all learners.

    Args:
        n: number of gossiping learners (nodes for H-AD-PSGD).
        scheme: ``ring``, ``random_ring`` or ``exponential``.
        seed: the shared seed of the randomized ring (every learner must use the same).
    """

    def __init__(self, n: int, scheme: str = "random_ring", seed: int = 0) -> None:
        if n < 1:
            raise AsrtrainError(f"topology: need at least one learner, got {n}")
        if scheme not in SCHEMES:
            raise AsrtrainError(f"topology: unknown scheme {scheme!r}; use one of {SCHEMES}")
        if seed < 0:
            raise AsrtrainError(f"topology: seed {seed}: expected a non-negative integer")
        self.n = n
        self.scheme = scheme
        self.seed = seed
        ring = scheme in ("ring", "random_ring")
        #: weight of a neighbour's model: 1/3 on a ring of 3 or more, exact averaging otherwise.
        self.weight = 1.0 / 3.0 if ring and n >= 3 else 0.5
        self._offsets = _exponential_offsets(n)

    def permutation(self, r: int) -> list[int]:
        """The ring order of round ``r`` (identity for the fixed ring)."""
        if self.scheme == "random_ring":
            return [int(i) for i in np.random.default_rng([self.seed, r]).permutation(self.n)]
        return list(range(self.n))

    def phases(self, r: int) -> list[list[Pair]]:
        """The matchings of round ``r``, in the order every learner runs them."""
        if self.n < 2:
            return []
        if self.scheme in ("ring", "random_ring"):
            return _ring_phases(self.permutation(r))
        offset = self._offsets[r % len(self._offsets)]
        # An odd number of learners is not bipartite: rotate the labels every cycle of offsets so
        # the learner left out of the even/odd split changes.
        shift = (r // len(self._offsets)) % self.n if self.n % 2 else 0
        taken: set[int] = set()
        pairs: list[Pair] = []
        for k in range(0, self.n - self.n % 2, 2):
            i, j = (k + shift) % self.n, (k + offset + shift) % self.n
            if i != j and i not in taken and j not in taken:
                pairs.append((i, j))
                taken.update((i, j))
        return [pairs]

    def partners(self, me: int, r: int) -> list[int | None]:
        """For each phase of round ``r``, the partner of learner ``me`` (None: idle in it)."""
        out: list[int | None] = []
        for phase in self.phases(r):
            partner = None
            for i, j in phase:
                if i == me:
                    partner = j
                elif j == me:
                    partner = i
            out.append(partner)
        return out

    def mixing_matrix(self, r: int) -> np.ndarray:
        """``W_r``: the matrix one round applies to the stacked models (dense: at most
        ``MAX_DENSE_NODES`` members)."""
        _check_dense(self.n, self.scheme)
        w = np.eye(self.n)
        for phase in self.phases(r):
            for i, j in phase:
                w[i, i] -= self.weight
                w[j, j] -= self.weight
                w[i, j] += self.weight
                w[j, i] += self.weight
        return w

    def expected_gram(self) -> np.ndarray:
        """``E[W^T W]`` over rounds (exact: closed form for the random ring, a cycle otherwise)."""
        _check_dense(self.n, self.scheme)
        if self.scheme == "ring":
            w = self.mixing_matrix(0)
            return w.T @ w
        if self.scheme == "random_ring":
            # A uniformly random relabelling of M has expectation a*I + b*(J - I).
            w = self.mixing_matrix(0) if self.n > 1 else np.eye(1)
            m = w.T @ w
            if self.n == 1:
                return m
            a = np.trace(m) / self.n
            b = (m.sum() - np.trace(m)) / (self.n * (self.n - 1))
            return a * np.eye(self.n) + b * (np.ones((self.n, self.n)) - np.eye(self.n))
        # One matching a round: W^T W = W^2 is the identity but for a 2 x 2 block per pair.
        cycle = len(self._offsets) * (self.n if self.n % 2 else 1)
        w = self.weight
        gram = np.zeros((self.n, self.n))
        for r in range(cycle):
            pairs = np.array([p for phase in self.phases(r) for p in phase], dtype=int)
            gram[np.diag_indices(self.n)] += 1.0
            if len(pairs):
                i, j = pairs[:, 0], pairs[:, 1]
                gram[i, i] += (1 - w) ** 2 + w * w - 1.0
                gram[j, j] += (1 - w) ** 2 + w * w - 1.0
                gram[i, j] += 2 * w * (1 - w)
                gram[j, i] += 2 * w * (1 - w)
        return gram / cycle

    def second_eigenvalue(self) -> float:
        """``lambda_2(E[W^T W])``, without an n x n matrix where a closed form exists: the
        random ring's expectation is ``a I + b (J - I)`` (``lambda_2 = a - b``, from the
        Frobenius norm of one round's W, W doubly stochastic), the fixed ring's W is circulant
        (eigenvalues ``1 - w (2 - 2 cos(2 pi k / n))``). The exponential graph is computed
        dense, up to ``MAX_DENSE_NODES`` members."""
        n = self.n
        if n == 1:
            return 0.0
        if self.scheme == "random_ring":
            frobenius = self._frobenius2(0)
            return frobenius / n - (n - frobenius) / (n * (n - 1))
        if self.scheme == "ring" and n >= 3:
            k = np.arange(1, n)
            return float(np.max((1.0 - self.weight * (2.0 - 2.0 * np.cos(2 * np.pi * k / n)))
                                ** 2))
        return second_eigenvalue(self.expected_gram())

    def _frobenius2(self, r: int) -> float:
        """``||W_r||_F^2`` from the round's pairs, in O(n)."""
        off: dict[tuple[int, int], float] = {}
        diag = np.ones(self.n)
        for phase in self.phases(r):
            for i, j in phase:
                diag[i] -= self.weight
                diag[j] -= self.weight
                key = (min(i, j), max(i, j))
                off[key] = off.get(key, 0.0) + self.weight
        return float((diag ** 2).sum() + 2.0 * sum(v * v for v in off.values()))


#: The most members whose mixing matrices are built dense (n x n float64, and an eigenvalue
#: decomposition of O(n^3)): 2048 take 32 MiB and seconds; 100,000 would take 75 GiB.
MAX_DENSE_NODES = 2048


#: The exponential graph of an odd number of members cycles through n times its offsets'
#: rounds; beyond this many members that is more work than a command should do.
MAX_ODD_EXPONENTIAL = 513


def _check_dense(n: int, scheme: str) -> None:
    if scheme == "exponential" and n % 2 and n > MAX_ODD_EXPONENTIAL:
        raise AsrtrainError(
            f"topology exponential: {n} nodes, an odd number above {MAX_ODD_EXPONENTIAL}: its "
            f"schedule cycles through {n} x {len(_exponential_offsets(n))} rounds, too many to "
            "average here; use an even number of nodes (up to "
            f"{MAX_DENSE_NODES}), or ring or random_ring (closed forms for any size)")
    if n > MAX_DENSE_NODES:
        raise AsrtrainError(
            f"topology {scheme}: {n} nodes is more than the {MAX_DENSE_NODES} whose mixing "
            f"matrices are computed dense ({n} x {n} x 8 bytes = {n * n * 8 / 2**30:.1f} GiB); "
            "ring and random_ring have closed forms for any size, or use fewer nodes "
            "(--per-node groups learners into nodes)")


def hierarchical_gram(node_gram: np.ndarray, per_node: int) -> np.ndarray:
    """``E[W^T W]`` of learners when nodes of ``per_node`` learners average exactly inside."""
    return np.kron(node_gram, np.full((per_node, per_node), 1.0 / per_node))


def second_eigenvalue(gram: np.ndarray) -> float:
    """``lambda_2``: the largest eigenvalue after the consensus direction (the all-ones vector)."""
    n = gram.shape[0]
    if n == 1:
        return 0.0
    eig = np.sort(np.linalg.eigvalsh((gram + gram.T) / 2.0))[::-1]
    return float(eig[1])


def spectral_gap(learners: int, scheme: str = "random_ring", per_node: int = 1,
                 seed: int = 0) -> float:
    """``1 - lambda_2(E[W^T W])`` of ``learners`` learners, ``per_node`` of them on each node."""
    if per_node < 1 or learners % per_node:
        raise AsrtrainError(
            f"topology: {learners} learners do not split into nodes of {per_node}; "
            "choose per_node dividing the number of learners"
        )
    if learners < 1:
        raise AsrtrainError(f"topology: need at least one learner, got {learners}")
    # E[W^T W] of the learners is kron(G, J / per_node) (``hierarchical_gram``), whose
    # eigenvalues are G's and zeros: G is positive semi-definite, so its lambda_2 is G's.
    return 1.0 - Schedule(learners // per_node, scheme, seed).second_eigenvalue()


def describe(learners: int, scheme: str, per_node: int = 1, seed: int = 0) -> str:
    """A one-line summary of a configuration's topology and spectral gap, printed at start."""
    gap = spectral_gap(learners, scheme, per_node, seed)
    nodes = learners // per_node
    rounds = math.inf if gap <= 0 else math.log(0.01) / math.log(max(1e-300, 1.0 - gap))
    return (
        f"topology {scheme}: {learners} learners = {nodes} nodes x {per_node}; "
        f"spectral gap 1 - lambda2(E[W^T W]) = {gap:.4f} "
        f"(about {rounds:.0f} rounds to shrink the squared consensus distance 100x)"
    )


@click.command("topology")
@click.option("--learners", type=int, required=True, help="Total number of learners.")
@click.option("--per-node", type=int, default=1, show_default=True,
              help="Learners per node (H-AD-PSGD super-learners; 1 for AD-PSGD).")
@click.option("--scheme", type=click.Choice(SCHEMES), default="random_ring", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def topology_command(learners: int, per_node: int, scheme: str, seed: int) -> None:
    """Print the spectral gap of a gossip configuration."""
    try:
        click.echo(describe(learners, scheme, per_node, seed))
    except AsrtrainError as e:
        raise click.ClickException(str(e)) from None
