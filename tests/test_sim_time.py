"""The simulator's time model (asrtrain.simulate.timing, issue 24 items 2 and 3): its arithmetic,
its agreement with the event timing of the gossip thread, and the committed results behind
docs/science.md (bench/seeds_time.py, bench/sim_calibrate.py) against the doc's tables."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import seeds_time  # bench/seeds_time.py (conftest puts bench/ on the path)
import sim_calibrate  # bench/sim_calibrate.py

from asrtrain.distributed.registry import sim_shape
from asrtrain.distributed.topology import Schedule
from asrtrain.simulate.engine import SimConfig
from asrtrain.simulate.timing import (
    EXCHANGE,
    GossipClock,
    LinkCosts,
    Network,
    gossip_events,
    placement,
    ring_allreduce_s,
    step_time,
)

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "science.md"
MB = 1e6


def test_ring_allreduce_is_bandwidth_optimal_with_latency_per_message() -> None:
    assert ring_allreduce_s(1, 100 * MB, 1e9, 1e-3) == 0.0
    # 4 peers: each link carries 2*3/4 of the bytes in 6 messages.
    assert ring_allreduce_s(4, 100 * MB, 1e9, 1e-3) == pytest.approx(0.15 + 0.006)
    # Bandwidth term bounded by 2 bytes/bw however many peers.
    assert ring_allreduce_s(1024, 100 * MB, 1e9, 0.0) < 0.2


def test_ssgd_pays_the_nic_across_nodes_and_the_intra_links_inside_one() -> None:
    net = Network(bandwidth=1e9, latency_s=1e-4, intra_bandwidth=1e10, intra_latency_s=1e-5)
    ssgd = sim_shape("ssgd")
    across = step_time(ssgd, 8, 4, 2, 0.1, 100 * MB, net, 0, False)
    inside = step_time(ssgd, 8, 8, 1, 0.1, 100 * MB, net, 0, False)
    assert across.allreduce_s == pytest.approx(ring_allreduce_s(8, 100 * MB, 1e9, 1e-4))
    assert inside.allreduce_s == pytest.approx(ring_allreduce_s(8, 100 * MB, 1e10, 1e-5))
    assert across.step_s == pytest.approx(0.1 + across.allreduce_s)
    assert across.round_s == 0.0 and across.rounds_per_step == 0.0


def test_compute_waits_for_gossip_only_in_the_seeds_learner_and_delay_by_one_hides_it() -> None:
    """An exchange slower than a step: this trainer's learner steps on and its rounds thin out;
    the seeds' learner waits for its round (compute + round), unless delay-by-one lets the round
    travel during the next step (max of the two)."""
    net = Network(bandwidth=1e8, latency_s=1e-3)  # 100 MB/s: a 100 MB exchange takes ~1 s
    shape = sim_shape("adpsgd")
    ours = step_time(shape, 8, 1, 8, 0.5, 100 * MB, net, 2, False)
    assert ours.exchange_s == pytest.approx(1e-3 + 1.0)
    assert ours.round_s == pytest.approx(2 * ours.exchange_s)
    assert ours.step_s == 0.5 and ours.wait_s == 0.0
    assert ours.rounds_per_step == pytest.approx(0.5 / ours.round_s)
    waits = step_time(shape, 8, 1, 8, 0.5, 100 * MB, net, 2, False, compute_waits=True)
    hides = step_time(shape, 8, 1, 8, 0.5, 100 * MB, net, 2, True, compute_waits=True)
    assert waits.step_s == pytest.approx(0.5 + waits.round_s)
    assert hides.step_s == pytest.approx(max(0.5, hides.round_s))
    assert hides.step_s < waits.step_s
    fast = step_time(shape, 8, 1, 8, 5.0, 100 * MB, net, 2, True, compute_waits=True)
    assert fast.step_s == 5.0 and fast.rounds_per_step == 1.0  # delay-by-one hides it all


def test_learners_of_a_node_share_its_nic_hadpsgd_leaders_do_not() -> None:
    net = Network(bandwidth=1e9, intra_bandwidth=1e10)
    flat = step_time(sim_shape("adpsgd"), 8, 4, 2, 0.1, 100 * MB, net, 2, False)
    # 4 members a node, 8 in all: 4 * 4/7 of a node's members cross its NIC in a phase.
    assert flat.exchange_s == pytest.approx(0.1 * 4 * 4 / 7)
    hier = step_time(sim_shape("hadpsgd"), 8, 4, 2, 0.1, 100 * MB, net, 1, False)
    assert hier.exchange_s == pytest.approx(0.1)  # one leader a node
    # The node's gradient allreduce, and the leader's gossip change shared in the node.
    assert hier.allreduce_s == pytest.approx(ring_allreduce_s(4, 100 * MB, 1e10, 0.0)
                                             + 0.75 * 100 * MB / 1e10)
    assert flat.allreduce_s == 0.0
    with pytest.raises(ValueError, match="bandwidth=0"):
        Network(bandwidth=0)


def test_members_sit_on_machines_in_rank_order() -> None:
    assert placement(8, 2) == (0, 0, 0, 0, 1, 1, 1, 1)
    assert placement(3, 8) == (0, 1, 2)  # more machines than members: one each
    assert placement(5, 2) == (0, 0, 1, 1, 1)  # the last machine takes what is left
    # the simulator places its members so: a node's learners on one machine (``nodes``), one
    # machine per member by default
    assert SimConfig(learners=8, bandwidth=1e8, nodes=2).link_costs(MB).machine == placement(8, 2)
    assert SimConfig(learners=8, backend="hadpsgd", per_node=4,
                     bandwidth=1e8).link_costs(MB).machine == (0, 1)
    assert SimConfig(learners=8).link_costs(MB) is None  # no time model: exchange_s as given


def test_a_pair_pays_the_nics_it_crosses_shared_with_the_phases_other_crossings() -> None:
    """Each crossing exchange sends one message out of each of its two machines: a NIC carries
    as many as the phase's (with delay-by-one, the round's) crossing pairs touching it; a pair
    on one machine pays the intra links."""
    net = Network(bandwidth=1e8, latency_s=1e-3, intra_bandwidth=1e10)
    local = 100 * MB / 1e10
    cross = lambda k: 1e-3 + k * 100 * MB / 1e8  # noqa: E731 - k messages on the busier NIC
    two = LinkCosts(net, 100 * MB, placement(4, 2))  # 0, 1 | 2, 3
    phases = [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]
    assert two.of_round(phases, False) == [[pytest.approx(local)] * 2,
                                           [pytest.approx(cross(2))] * 2]
    # delay-by-one posts both phases at once: the same two crossings share the NICs
    assert two.of_round(phases, True) == two.of_round(phases, False)
    assert two.of_round([[(0, 2), (1, 3)], [(0, 3), (1, 2)]], True) == [
        [pytest.approx(cross(4))] * 2] * 2
    three = LinkCosts(net, 100 * MB, placement(6, 3))  # 0, 1 | 2, 3 | 4, 5
    assert three.of_round([[(0, 2), (1, 4), (3, 5)]], False) == [
        [pytest.approx(cross(2))] * 3]  # every machine sends two messages
    assert three.of_round([[(0, 2), (1, 3), (4, 5)]], False) == [
        [pytest.approx(cross(2)), pytest.approx(cross(2)), pytest.approx(local)]]


def test_with_delay_by_one_a_round_counts_at_its_trigger_and_the_drain_runs_it() -> None:
    """The real thread (Gossip._rounds) counts a round as started at its trigger, then waits for
    the previous round's messages and posts it: a round triggered before the epoch's end, even
    one posted after it, is run whole by the drain. Two members, exchanges of 1 s, steps ending
    at 0.1, 0.2, 0.3: round 0 posted at 0.1 (in at 1.1), round 1 counted at 0.2, posted at 1.1
    and in at 2.1, where the drain ends; without delay-by-one round 0 ends at 1.1 and no step
    is left to trigger another."""
    sched = Schedule(2, "random_ring", 1)
    ends = [np.array([0.1, 0.2, 0.3])] * 2
    events, end = gossip_events(sched, ends, 0.0, GossipClock(), True, 1e9, 1.0, 0)
    assert end == pytest.approx(2.1)
    assert sorted({e[1] for e in events if e[3] == EXCHANGE}) == [0, 1]
    events, end = gossip_events(sched, ends, 0.0, GossipClock(), False, 1e9, 1.0, 0)
    assert end == pytest.approx(1.1)
    assert {e[1] for e in events if e[3] == EXCHANGE} == {0}


@pytest.mark.parametrize(("delay_by_one", "hold_s", "drained"), [
    (True, 0.0, 2.1), (True, 1.0, 3.1), (False, 0.0, 1.1), (False, 1.0, 2.1)])
def test_rounds_counted_until_the_drains_hold_are_run_whole(
        delay_by_one: bool, hold_s: float, drained: float) -> None:
    """The learners that reached the epoch's end go on counting rounds until the drain's
    barrier is over (``hold_s`` after the last step, the trainer's measured gossip_hold_s), and
    the thread's idle clock runs from a round's count (Gossip._rounds), so a round whose wait
    outlasted ``idle_s`` is followed by a count as soon as it is posted. Two members, exchanges
    of 1 s, steps ending at 0.1, 0.2, 0.3, idle 0.5 s. With delay-by-one: round 1, counted at 0.2,
    is posted at 1.1 when round 0's messages are in; round 2 is counted then, inside a hold of 1
    s (to 1.3), and runs whole to 3.1 (counted from round 1's post, 1.6, it would miss the hold
    and the drain would end at 2.1). Without it: round 1 starts when round 0 ends at 1.1, inside
    the hold, and ends at 2.1."""
    sched = Schedule(2, "random_ring", 1)
    ends = [np.array([0.1, 0.2, 0.3])] * 2
    _events, end = gossip_events(sched, ends, 0.0, GossipClock(), delay_by_one, 0.5, 1.0, 0,
                                 hold_s)
    assert end == pytest.approx(drained)


def test_the_drain_waits_for_the_slowest_pair_of_a_round() -> None:
    """The epoch's drain with each pair's cost: a round whose pairs are all on one machine ends
    at once; one with pairs across a slow link ends when their shared bytes are through, later
    than the mean exchange (step_time's steady state) says."""
    net = Network(bandwidth=1e6)  # 1 MB/s: a 1 MB message takes 1 s
    sched = Schedule(8, "random_ring", 1)
    ends = [np.array([0.1]) for _ in range(8)]
    one_machine = LinkCosts(net, MB, placement(8, 1))
    _events, end = gossip_events(sched, ends, 0.0, GossipClock(), False, 1e9, one_machine, 0)
    assert end == pytest.approx(0.1)
    costs = LinkCosts(net, MB, placement(8, 2))
    _events, end = gossip_events(sched, ends, 0.0, GossipClock(), False, 1e9, costs, 0)
    worst = sum(max(row) for row in costs.of_round(sched.phases(0), False))
    assert end == pytest.approx(0.1 + worst)
    mean = step_time(sim_shape("adpsgd"), 8, 4, 2, 0.1, MB, net, 2, False).exchange_s
    assert worst > 2 * mean


@pytest.mark.parametrize(("compute_s", "delay_by_one"), [(0.4, False), (0.4, True),
                                                         (2.0, False)])
def test_the_analytic_round_rate_is_the_gossip_threads_event_timing(
        compute_s: float, delay_by_one: bool) -> None:
    """Equal learners stepping every ``compute_s``: the rounds the event timing of the gossip
    thread (timing.gossip_events, what the simulator runs) fits into 60 steps are the model's
    rounds per step times 60, to a round or two (the first step and the drain)."""
    net = Network(bandwidth=1e8)
    members, steps = 8, 60
    st = step_time(sim_shape("adpsgd"), members, 1, members, compute_s, 50 * MB, net, 2,
                   delay_by_one)
    sched = Schedule(members, "random_ring", 1)
    ends = [np.arange(1, steps + 1) * st.step_s for _ in range(members)]
    events, _end = gossip_events(sched, ends, 0.0, GossipClock(), delay_by_one, 1e9,
                                 st.event_exchange_s, 0)
    rounds = max(e[1] for e in events if e[3] == EXCHANGE) + 1
    assert abs(rounds - st.rounds_per_step * steps) <= 2, (rounds, st.rounds_per_step * steps)


# -- the committed results and docs/science.md ------------------------------------------------

def _doc_table(after: str) -> list[list[str]]:
    """The rows of the first table after the line starting with ``after``."""
    text = DOC.read_text()
    start = text.index(after)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # past the header and its rule


def test_the_seeds_prediction_is_the_committed_json_and_the_docs_table() -> None:
    committed = json.loads((REPO / "docs" / "science" / "seeds_time.json").read_text())
    assert seeds_time.result() == committed  # the model gives what was committed
    doc = _doc_table("Predicted hours for the seeds' runs")
    expected = [[c.strip() for c in line.strip("|").split("|")]
                for line in seeds_time.table(committed).splitlines()[2:]]
    assert doc == expected
    # The inputs the doc states are the JSON's.
    assert committed["v100_step_s"] == pytest.approx(128 * 21 * 7 * 24 * 3600 / (16 * 720e6))
    assert committed["inputs"]["parameters"] == 42.6e6


def test_the_h100_prediction_is_the_committed_json_and_the_docs_table() -> None:
    """The same runs with the step measured on an H100 (docs/results/gpu/gpu_h100.json): the
    committed JSON is what the model gives from that file, and the doc's table is the JSON's."""
    committed = json.loads((REPO / "docs" / "science" / "seeds_time_h100.json").read_text())
    gpu_json = REPO / "docs" / "results" / "gpu" / "gpu_h100.json"
    assert seeds_time.result(gpu_json) == committed
    doc = _doc_table("Predicted hours with the H100 step")
    expected = [[c.strip() for c in line.strip("|").split("|")]
                for line in seeds_time.table(committed).splitlines()[2:]]
    assert doc == expected
    row = committed["measured_gpu"]
    assert (row["chunks"], row["precision"], row["chunk_data"]) == (128, "fp32", "resident")
    assert committed["gpu_step_s"] == pytest.approx(128 * 21 / row["end_to_end_fps"])
    # AD-PSGD's learner that never waits runs at the measured step: ideal scaling of one GPU
    ours = {p["learners"]: p["hours"] for p in committed["predicted"]
            if p["method"] == "adpsgd" and not p["compute_waits"] and not p["delay_by_one"]}
    for n, hours in ours.items():
        assert hours == pytest.approx(16 * 720e6 / row["end_to_end_fps"] / 3600 / n)


def test_every_quantitative_figure_of_the_seeds_has_a_claims_row_with_a_verdict() -> None:
    rows = _doc_table("### Every quantitative figure of the seeds")
    figures = {r[0]: r for r in rows}
    verdicts = ("reproduced", "predicted by the time model", "not reproducible here", "input")
    for row in rows:
        assert any(v in row[2].lower() for v in verdicts), row
    text = " ".join(" ".join(r) for r in rows)
    for figure in ("11.5 h", "5.2 h", "2.28 h", "1.98 h", "7.6", "13.2", "7.5", "7.7", "42.6M",
                   "100 Gb/s", "12,288", "4,096", "8,192", "a week", "32", "64", "128"):
        assert figure in text, figure
    wer = [r for name, r in figures.items() if "WER" in name]
    assert len(wer) == 3 and all("not reproducible here" in r[2] for r in wer)
    committed = json.loads((REPO / "docs" / "science" / "seeds_time.json").read_text())
    hours = {(p["method"], p["learners"], p["compute_waits"], p["delay_by_one"]): p["hours"]
             for p in committed["predicted"]}
    for row in rows:  # every predicted hour quoted in the claims table is the JSON's
        for method, n, h in re.findall(r"(ssgd|adpsgd|hadpsgd) at (\d+): ([\d.]+) h", row[3]):
            assert any(f"{v:.2f}" == h for k, v in hours.items()
                       if k[0] == method and k[1] == int(n)), (method, n, h)


@pytest.mark.parametrize(("name", "heading"), [
    ("sim_calibrate.json", "### Calibration against real gloo runs"),
    ("sim_calibrate_100mbit.json", "At 100 Mbit/s, with the fraction fitted at 20")])
def test_the_calibration_table_is_the_committed_runs(name: str, heading: str) -> None:
    """docs/science.md's calibration tables: each row's figures are the committed JSON's, and
    the JSON's comparisons are what bench/sim_calibrate.py computes from its runs."""
    committed = json.loads((REPO / "docs" / "science" / name).read_text())
    again = sim_calibrate.analyse(committed["runs"], committed["rate"],
                                  committed["given_fraction"], committed["given_hold_messages"])
    assert json.loads(json.dumps(again)) == {k: committed[k] for k in again}
    doc = _doc_table(heading)
    assert len(doc) == len(committed["comparisons"])
    for row, c in zip(doc, committed["comparisons"], strict=True):
        assert row[:3] == [c["backend"], str(c["learners"]), "yes" if c["delay_by_one"] else
                           "no"]
        numbers = [float(x) for x in row[3:8]]
        assert numbers == pytest.approx([c["unlimited_wall_s"], c["real_wall_s"],
                                         c["predicted"]["wall_s"], c["ratio"],
                                         c["ratio_at_nominal_rate"]], abs=0.0051)
        if c["backend"] == "ssgd":   # no drain
            assert row[8] == "—"
        else:                        # the drain's hold: the run's measured one / the model's
            real, model = row[8].split(" / ")
            assert real == ("—" if c["real_hold_s"] is None else f"{c['real_hold_s']:.2f}")
            assert float(model) == pytest.approx(c["hold_s"], abs=0.0051)
        assert math.isfinite(c["load"][1])
