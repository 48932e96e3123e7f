"""Epochs by global progress: learners that do not keep in step claim the next unit of the
epoch's one order from a counter in the rendezvous store.

An epoch is the training set once across all learners. Its order is one list of units (a block
of :meth:`asrtrain.train.chunks.ChunkSet.plan` for the hybrid task, a batch for CTC), the same on
every learner for a seed; a learner takes unit ``k`` when the store's ``add`` on the epoch's key
hands it ``k`` (one integer, atomic in the store: no barrier, no learner waits for another), so a
fast learner takes more units and every unit is taken exactly once. torchrun's store is served by
its agent (``TORCHELASTIC_USE_AGENT_STORE``), so a learner that is stopped or slow holds nobody's
claim up; the key names the epoch and torchrun's restart count, so a restarted group counts
afresh.

A node of H-AD-PSGD (``members`` > 1) steps in lockstep: its leader claims ``members``
consecutive units at once and posts the first under a key of the node's, member ``i`` takes the
``i``-th; a node stops at the first claim that is not whole, so at most ``members - 1`` units
(equal-sized units: CTC batches) of an epoch go untrained.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from asrtrain import AsrtrainError


def default_store() -> dist.Store:
    """The default process group's store (torchrun's rendezvous store)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError) as e:
        raise AsrtrainError(f"epoch claims need the process group's store: {e}") from e


class EpochClaims:
    """``claims(total)``: the number of the next unit of epoch ``epoch`` (of ``total``) this
    learner trains, or None when the epoch's units are all taken.

    Args:
        store: the store all learners share (:func:`default_store`).
        epoch: the epoch (its own counter).
        members, member, node: a lockstep node's size, this learner's index in it and the
            node's number (one-learner nodes: 1, 0, its rank).
        guard: runs each store call, ``guard(what, call)``, and turns its failure into an
            error that names the learner or node at fault (the backends pass
            :meth:`asrtrain.distributed.comm.Comm.guarded`: a store that went away with node
            0's launcher is "node 0 is lost", not "Connection reset by peer").
    """

    def __init__(self, store: dist.Store, epoch: int, members: int = 1, member: int = 0,
                 node: int = 0, guard: Callable[[str, Callable[[], Any]], Any] | None = None
                 ) -> None:
        if not 0 <= member < members:
            raise AsrtrainError(f"epoch claims: member {member} of a node of {members}")
        self.store = store
        # torchrun's restart count: a group it restarts may share the store of the one before
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.key = f"asrtrain/attempt{attempt}/epoch{epoch}/claimed"
        self.members, self.member, self.node = members, member, node
        self.claims = 0       # claims made (a node's sequence number)
        self.units = 0        # units this learner took
        self.guard = guard or (lambda what, call: call())

    def __call__(self, total: int) -> int | None:
        first = self.guard("the claim of the epoch's next unit", self._claim)
        self.claims += 1
        if first + self.members > total:
            return None
        self.units += 1
        return first + self.member

    def _claim(self) -> int:
        """The first unit of this claim (a node's: its leader's claim of ``members`` units)."""
        if self.members == 1:
            return self.store.add(self.key, 1) - 1
        posted = f"{self.key}/node{self.node}/{self.claims}"
        if self.member == 0:
            first = self.store.add(self.key, self.members) - self.members
            self.store.set(posted, str(first))
            return first
        return int(self.store.get(posted))
