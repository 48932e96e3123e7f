"""When things happen in a simulated epoch: each gossip member's steps, and the rounds of the
schedule as the real gossip thread (:class:`asrtrain.distributed.gossip.Gossip`) would run them.

Compute never waits for gossip (it runs in a background thread), so the step times are known in
advance; the rounds then follow from them, round after round, with the thread's rules:

- a member counts round ``r`` once it posted the previous round and either a step finished since
  it counted that round, or ``idle_s`` passed since it counted it (never before its first step);
  without delay-by-one it runs it at once, after the previous round is done;
- without delay-by-one a phase's exchange ends ``exchange_s`` after both partners reached it,
  and the round's change is applied when its last phase ends;
- with delay-by-one the messages are posted at the round's start and travel while the member
  steps on: the change is applied when the next round starts, which waits for the messages
  (the thread counts that next round before the wait, so the drain runs it whole; and a round
  whose wait outlasted ``idle_s`` is followed by a count as soon as it is posted);
- at the end of the epoch the learners meet in a barrier; until it is over, ``hold_s`` after the
  last step, members go on counting rounds (the arrived learners' idle trigger); then every
  member finishes the rounds counted anywhere (the drain before the consensus,
  :func:`asrtrain.distributed.gossip.drain_gossip`) and starts no more.

The result is a list of events ``(time, round, phase, kind, a, b)`` in the order they happen;
ties are broken so that a step comes before gossip at the same moment and a round's exchanges
before its change is applied.

The time model (:func:`step_time`, :class:`Network`, :func:`ring_allreduce_s`; issue 24) says
what those times are from bytes, bandwidth and latency: a sync group's allreduce added to each
step, an exchange's cost for the rounds, and, for the seeds' learner, which waits for its
exchange, the step period with and without delay-by-one (docs/science.md, "The time model").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from asrtrain.distributed.topology import Schedule

STEP, EXCHANGE, APPLY, LOG, START = 0, 1, 2, 3, 4
_LAST = 1 << 30  # the phase slot of a round's apply and log events: after all its exchanges

Event = tuple[float, int, int, int, int, int]


@dataclass
class GossipClock:
    """What the timing of the next epoch needs to know of the rounds so far."""

    rounds: int = 0          # rounds every member has finished (equal after a drain)
    stepped: bool = False    # whether any step was taken yet (no round before the first)


def step_events(ends: list[np.ndarray], first: int = 0) -> list[Event]:
    """One event per step: member ``a``'s step ``b`` (numbered from ``first``) ends at its
    time."""
    return [(float(t), -1, 0, STEP, g, first + k) for g, row in enumerate(ends)
            for k, t in enumerate(row)]


def step_starts(starts: list[np.ndarray], first: int = 0) -> list[Event]:
    """One event per step start: member ``a``'s step ``b`` reads its model (after a step that
    ends at the same moment, before gossip then)."""
    return [(float(t), -1, 1, START, g, first + k) for g, row in enumerate(starts)
            for k, t in enumerate(row)]


def sync_segments(steps: int, done: int, every: int) -> list[tuple[int, int]]:
    """The epoch's steps ``[lo, hi)`` between the points where all learners wait for each
    other: the epoch's end, and (``every`` > 0) each global step ``done + hi`` that is a
    multiple of ``every`` (the real trainer's collective consensus distance at each
    ``trainer.log_every``)."""
    cuts = [k for k in range(1, steps) if every and (done + k) % every == 0] + [steps]
    return list(zip([0, *cuts[:-1]], cuts, strict=True))


def _trigger(ends: np.ndarray, last_start: float, idle_s: float, may_idle: bool) -> float:
    """When a member whose last round started at ``last_start`` wants its next round: after its
    next step, or ``idle_s`` after that start (only once it has stepped at all)."""
    k = int(np.searchsorted(ends, last_start, side="right"))
    step = float(ends[k]) if k < len(ends) else math.inf
    return min(step, last_start + idle_s) if may_idle else step


def gossip_events(schedule: Schedule, ends: list[np.ndarray], t0: float, clock: GossipClock,
                  delay_by_one: bool, idle_s: float, exchange_s: float | LinkCosts,
                  log_every: int, hold_s: float = 0.0) -> tuple[list[Event], float]:
    """The gossip events of one epoch that starts at ``t0`` (members' step end times ``ends``);
    returns them and the time the epoch's drain is over. ``clock`` is advanced.
    ``exchange_s``: the seconds of every exchange, or :class:`LinkCosts`, each pair's from where
    the members sit. ``hold_s``: the drain's barrier, from the last step until rounds stop being
    counted (the trainer measures it: ``gossip_hold_s`` of an epoch's summary)."""
    n = len(ends)
    t_end = max((float(e[-1]) for e in ends if len(e)), default=t0)
    t_hold = t_end + hold_s
    first = [float(e[0]) if len(e) else math.inf for e in ends]
    last_count = np.full(n, t0)     # when each member's thread last counted a round
    last_post = np.full(n, t0)      # and last started (posted) one
    ready = np.full(n, t0)          # previous round done (or, delay-by-one: its messages in)
    pending: list[int] = []         # delay-by-one: members with a posted round to apply
    events: list[Event] = []
    finish = t0
    r = clock.rounds
    while n > 1:
        # The idle clock runs from the last count; the next count comes once the last round
        # is posted (Gossip._rounds).
        trig = np.maximum(last_post, [_trigger(ends[i], last_count[i], idle_s,
                                               clock.stepped or last_count[i] >= first[i])
                                      for i in range(n)])
        # A round counts as started at its trigger, without delay-by-one once the previous
        # round is done; with it the thread counts the round, then waits for the previous
        # round's messages and posts it: a round so counted before the hold is one the drain
        # runs whole. The last step still triggers one.
        if (trig if delay_by_one else np.maximum(ready, trig)).min() > t_hold:
            break
        start = np.maximum(ready, np.minimum(trig, t_hold))  # the drain starts the rest at once
        if delay_by_one and pending:
            events += _applies(start, pending, r - 1, log_every)
        t, posted, touched = start.copy(), start.copy(), set()
        phases = schedule.phases(r)
        costs = (exchange_s.of_round(phases, delay_by_one) if isinstance(exchange_s, LinkCosts)
                 else [[exchange_s] * len(phase) for phase in phases])
        for p, phase in enumerate(phases):
            for (i, j), cost in zip(phase, costs[p], strict=True):
                e = max(t[i], t[j]) + cost
                events.append((e, r, p, EXCHANGE, i, j))
                touched.update((i, j))
                if delay_by_one:  # posted at the start; the messages are in at e
                    posted[i], posted[j] = max(posted[i], e), max(posted[j], e)
                else:  # one partner after the other
                    t[i] = t[j] = e
        if delay_by_one:
            ready, pending = posted, sorted(touched)
        else:
            ready = t
            events += _applies(t, sorted(touched), r, log_every)
        last_count = np.minimum(trig, t_hold) if delay_by_one else start
        last_post = start
        finish = max(finish, float(ready.max()))
        r += 1
    if delay_by_one and pending:  # the drain applies the last posted round
        events += _applies(np.maximum(ready, t_end), pending, r - 1, log_every)
    clock.rounds = r
    clock.stepped = clock.stepped or t_end > t0
    return events, max(finish, t_end)


def _applies(times: np.ndarray, members: list[int], r: int, log_every: int) -> list[Event]:
    """Round ``r``'s changes applied at ``times`` (per member), and its log point after the last
    one every ``log_every`` rounds."""
    out = [(float(times[i]), r, _LAST, APPLY, i, -1) for i in members]
    if log_every and (r + 1) % log_every == 0:
        out.append((max(float(times[i]) for i in members), r, _LAST + 1, LOG, r + 1, -1))
    return out


# -- the time model (issue 24 item 2) ------------------------------------------------------------

@dataclass(frozen=True)
class Network:
    """What communication costs: ``bandwidth`` bytes/s of a node's NIC in each direction, shared
    by the node's learners whose messages cross it at once; ``latency_s`` a message's fixed cost
    (the wire's and the library's); inside a node ``intra_bandwidth`` / ``intra_latency_s``
    (NVLink or shared memory; ``inf``: free); ``copy_bandwidth`` bytes/s of a host copy, paid
    twice a gloo exchange of a GPU model (device to host, host to device; ``inf`` on a CPU)."""

    bandwidth: float
    latency_s: float = 0.0
    intra_bandwidth: float = math.inf
    intra_latency_s: float = 0.0
    copy_bandwidth: float = math.inf

    def __post_init__(self) -> None:
        for key in ("bandwidth", "intra_bandwidth", "copy_bandwidth"):
            if not getattr(self, key) > 0:
                raise ValueError(f"Network.{key}={getattr(self, key)}: must be positive")
        for key in ("latency_s", "intra_latency_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"Network.{key}={getattr(self, key)}: must not be negative")


def placement(members: int, machines: int) -> tuple[int, ...]:
    """The machine of each gossip member: members in rank order, ``members // machines`` a
    machine (the last takes what is left), as torchrun numbers the ranks of its nodes."""
    per = max(1, members // max(machines, 1))
    return tuple(min(i // per, max(machines, 1) - 1) for i in range(members))


@dataclass(frozen=True)
class LinkCosts:
    """Each exchange's seconds where the gossip members sit on machines (``machine[i]``: member
    ``i``'s, :func:`placement`): a pair on one machine pays the intra links; a pair across
    machines pays a latency and the model's bytes over the NICs, whose egress is shared by every
    crossing exchange of the phase under way on it (each sends one message out of each of its
    two machines), plus two host copies. With delay-by-one a round's phases are posted
    together, so all its crossing exchanges share the NICs. This is :func:`step_time`'s
    exchange, pair by pair: the steady state there takes the expected share of the NIC, which
    holds for the rounds in the middle of an epoch; the drain at its end waits for the slowest
    pairs of each round, which the expectation hides (docs/science.md, "Calibration")."""

    net: Network
    model_bytes: float
    machine: tuple[int, ...]

    def of_round(self, phases: list[list[tuple[int, int]]],
                 delay_by_one: bool) -> list[list[float]]:
        """The seconds of each pair's exchange, phase by phase."""
        copies = 2 * self.model_bytes / self.net.copy_bandwidth
        local = self.net.intra_latency_s + self.model_bytes / self.net.intra_bandwidth + copies
        groups = [phases] if delay_by_one else [[phase] for phase in phases]
        out: list[list[float]] = []
        for group in groups:
            load: dict[int, int] = {}
            for phase in group:
                for i, j in phase:
                    if self.machine[i] != self.machine[j]:
                        for m in (self.machine[i], self.machine[j]):
                            load[m] = load.get(m, 0) + 1
            for phase in group:
                out.append([local if self.machine[i] == self.machine[j] else
                            self.net.latency_s + copies + self.model_bytes * max(
                                load[self.machine[i]], load[self.machine[j]]) / self.net.bandwidth
                            for i, j in phase])
        return out


def ring_allreduce_s(k: int, nbytes: float, bandwidth: float, latency_s: float) -> float:
    """A ring allreduce of ``nbytes`` among ``k`` peers (reduce-scatter then all-gather: each
    link carries 2(k-1)/k of the bytes in 2(k-1) messages; Patarasuk and Yuan, "Bandwidth
    optimal all-reduce algorithms", JPDC 2009); 0 for one peer."""
    if k <= 1:
        return 0.0
    return 2 * (k - 1) / k * nbytes / bandwidth + 2 * (k - 1) * latency_s


@dataclass(frozen=True)
class StepTime:
    """Where a learner's seconds per step go, and how often its member gossips (the steady state
    of equal learners: a step of every learner takes the same time)."""

    compute_s: float     # forward, backward, update
    allreduce_s: float   # the sync group's gradient allreduce (and the node's gossip share)
    exchange_s: float    # one pairwise gossip exchange, as the gossip thread sees it
    round_s: float       # one gossip round (its phases one after the other, or overlapped)
    step_s: float        # the period of a step, waits included
    rounds_per_step: float

    delay_by_one: bool = False

    @property
    def event_exchange_s(self) -> float:
        """The ``exchange_s`` that gives :func:`gossip_events` these rounds: a pair's exchange,
        or with delay-by-one (whose phases it times as travelling side by side) the whole
        round's, the phases' messages sharing the NIC."""
        return self.round_s if self.delay_by_one else self.exchange_s

    @property
    def wait_s(self) -> float:
        """Seconds a step waits for gossip (only where compute waits for it)."""
        return self.step_s - self.compute_s - self.allreduce_s


def step_time(shape, learners: int, per_node: int, nodes: int, compute_s: float,
              model_bytes: float, net: Network, phases: int, delay_by_one: bool,
              compute_waits: bool = False) -> StepTime:
    """The seconds a step takes for ``learners`` on ``nodes`` machines (``per_node`` learners a
    node for a ``sync="node"`` backend) running a backend of ``shape``
    (:class:`asrtrain.distributed.registry.SimShape`): each learner computes for ``compute_s``;
    a sync group ring-allreduces the gradients (``model_bytes``) inside a node over the intra
    links, across nodes over the NIC; a gossiping member exchanges the whole model with one
    partner per phase of a round (``phases``: 2 for a randomized ring), paying a latency, the
    bytes over its node's NIC shared by the node's members whose exchanges cross it at once,
    and two host copies.

    Gossip and compute: ``compute_waits`` False is this trainer's gossip thread (the learner
    never waits; a round starts after a step once the previous round is done, so rounds thin
    out to one per ``round_s`` when an exchange is slower than a step, and delay-by-one, whose
    phases are posted together, only makes rounds shorter). True is the seeds' learner, which
    waits before its next step for its last exchange: without delay-by-one a step takes
    compute + round; with it the round travels during the next step, so max(compute, round)."""
    machines = max(nodes, 1)
    k = shape.group(learners, per_node)
    members = shape.members(learners, per_node)
    # A sync group inside one machine uses the intra links; one spread over machines, the NIC.
    across = shape.sync == "all" and machines > 1
    allreduce = ring_allreduce_s(k, model_bytes,
                                 net.bandwidth if across else net.intra_bandwidth,
                                 net.latency_s if across else net.intra_latency_s)
    if shape.sync == "node" and members > 1 and k > 1:
        allreduce += (k - 1) / k * model_bytes / net.intra_bandwidth + net.intra_latency_s
    exchange = round_ = 0.0
    rounds_per_step = 0.0
    base = compute_s + allreduce
    period = base
    if shape.gossip and members > 1:
        # A node's members whose partner of a phase is on another node share its NIC: with
        # partners drawn at random, a fraction (members - L) / (members - 1) of its L members.
        per_machine = max(1, members // machines)
        crossing = (members - per_machine) / (members - 1)
        sharing = max(1.0, per_machine * crossing)
        wire = model_bytes * sharing / net.bandwidth
        copies = 2 * model_bytes / net.copy_bandwidth
        exchange = net.latency_s + wire + copies
        # Delay-by-one posts a round's phases together: their bytes share the NIC, one latency.
        round_ = (net.latency_s + phases * (wire + copies) if delay_by_one
                  else phases * exchange)
        if compute_waits:
            period = max(base, round_) if delay_by_one else base + round_
            rounds_per_step = 1.0
        else:
            rounds_per_step = min(1.0, base / round_) if round_ > 0 else 1.0
    return StepTime(compute_s, allreduce, exchange, round_, period, rounds_per_step,
                    delay_by_one)
