"""No collective on the hot path of the gossiping backends (issue 23): the real trainer, real gloo
learners under torchrun, every collective counted in each learner.

Each learner runs this file as its module (``python -m test_hot_path CONFIG``, started by
:func:`asrtrain.distributed.launch.launch` as the train stage starts ``asrtrain.cli train``); the
probe below wraps, in that process only, every collective of ``torch.distributed``, the
collectives of the learner's :class:`~asrtrain.distributed.comm.Comm` and of its backend (drain,
consensus, metric averaging, step agreement), and the trainer's epoch phases, then runs the
learner as ``asrtrain train`` does. Every call is written, one JSON line, with the phase it
happened in: ``steps`` (inside ``_train_epoch``: from the epoch's claims to its last step),
``end`` (``_end_epoch``: drain, consensus, dev loss, checkpoints) or outside the epochs (setup,
early-stop agreement, closing). The gossip thread's point-to-point exchanges with a partner, on
its own group, are allowed on the hot path; nothing else is.

The module's top level imports only the standard library and pytest: the learners import it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The directory each learner's probe writes ``rank<r>.jsonl`` into (set by the test).
PROBE_ENV = "ASRTRAIN_HOT_PATH_PROBE"

#: torch.distributed's collectives (all ranks of a group take part) and point-to-point calls.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "gather_object", "scatter", "scatter_object_list")
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
#: Our own blocking calls: the Comm's and the backend's (each is, or wraps, a collective).
COMM_CALLS = ("allreduce", "allreduce_int", "broadcast_", "barrier")
BACKEND_CALLS = ("drain", "consensus", "consensus_distance", "consensus_with_distance",
                 "reduce_mean", "agree_min", "average_state", "broadcast_model")


# ----------------------------------------------------------------------------------------------
# The probe, in each learner process.


def _probe(config: str) -> None:
    """Install the counting wrappers, then be one learner of the run of ``config``."""
    import functools
    import inspect
    import threading

    import torch.distributed as dist

    from asrtrain.train import trainer
    from asrtrain.train.worker import run_learner

    sink = (Path(os.environ[PROBE_ENV]) / f"rank{os.environ['RANK']}.jsonl").open(
        "a", buffering=1, encoding="utf-8")
    lock = threading.Lock()
    where = {"phase": "setup", "epoch": 0}

    def record(kind: str, name: str, **extra) -> None:
        thread = threading.current_thread()
        entry = {"kind": kind, "name": name, "phase": where["phase"], "epoch": where["epoch"],
                 "thread": "main" if thread is threading.main_thread() else thread.name,
                 **extra}
        with lock:
            sink.write(json.dumps(entry) + "\n")

    def world(group) -> bool:
        return (group is None or group is dist.GroupMember.WORLD
                or group is dist.distributed_c10d._get_default_group())

    def dist_wrapper(name: str, fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def counted(*args, **kwargs):
            if name == "batch_isend_irecv":
                groups = [op.group for op in (args[0] if args else kwargs["p2p_op_list"])]
            else:
                groups = [sig.bind(*args, **kwargs).arguments.get("group")]
            record("dist", name, world=any(world(g) for g in groups))
            return fn(*args, **kwargs)
        return counted

    for name in (*COLLECTIVES, *P2P):
        if hasattr(dist, name):
            setattr(dist, name, dist_wrapper(name, getattr(dist, name)))

    def method_wrapper(kind: str, name: str, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            record(kind, name)
            return fn(*args, **kwargs)
        return counted

    def phase(name: str, fn):
        @functools.wraps(fn)
        def in_phase(run, epoch, *args, **kwargs):
            where.update(phase=name, epoch=epoch)
            try:
                return fn(run, epoch, *args, **kwargs)
            finally:
                where.update(phase="between", epoch=epoch)
        return in_phase

    trainer._train_epoch = phase("steps", trainer._train_epoch)
    trainer._end_epoch = phase("end", trainer._end_epoch)
    trainer._log_point = method_wrapper("trainer", "log_point", trainer._log_point)
    train = trainer.train

    def counted_train(cfg, backend):
        # the instance's methods: its own calls (self.drain() in consensus) are counted too
        for name in BACKEND_CALLS:
            if hasattr(backend, name):
                setattr(backend, name, method_wrapper("backend", name, getattr(backend, name)))
        for name in COMM_CALLS:
            setattr(backend.comm, name, method_wrapper("comm", name, getattr(backend.comm, name)))
        after_step = backend.after_step

        def step(*args, **kwargs):
            record("trainer", "step")
            return after_step(*args, **kwargs)
        backend.after_step = step
        return train(cfg, backend)

    trainer.train = counted_train  # run_learner imports it when called
    try:
        run_learner(config)
    finally:
        where.update(phase="exit")
        sink.close()


if __name__ == "__main__":
    _probe(sys.argv[1])


# ----------------------------------------------------------------------------------------------
# The test.


def _exp(root: Path) -> Path:
    """16 synthetic utterances with fbank features and character units (dev set = train)."""
    from conftest import write_datadir

    from asrtrain.data.datadir import DataDir
    from asrtrain.features import FeatureOptions, compute_features
    from asrtrain.lang.bpe import train_units

    data = write_datadir(root / "src", n_speakers=2, utts_per_speaker=8)
    (root / "data").mkdir()
    data.rename(root / "data" / "train")
    compute_features(root / "data" / "train", root / "feats", FeatureOptions(), nj=1)
    d = DataDir.read(root / "data" / "train")
    train_units([d.text[u] for u in d.utts], root / "lang" / "units.model")
    (root / "log").mkdir()
    return root


@pytest.fixture(scope="module")
def exp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _exp(tmp_path_factory.mktemp("exp"))


def _run(exp: Path, tmp_path: Path, backend: str, *overrides: str) -> list[list[dict]]:
    """Two learners of ``backend`` under torchrun, each counted by the probe: its records."""
    from omegaconf import OmegaConf
    from test_train_single import make_cfg

    cfg = make_cfg(exp, tmp_path, **{
        "trainer.backend": backend, "trainer.learners": 2, "trainer.epochs": 2,
        # about one utterance a batch: ~16 steps an epoch, a log point every other step
        "trainer.batch_frames": 100, "trainer.log_every": 2, "trainer.timeout_s": 120,
        **dict(o.split("=", 1) for o in overrides)})
    cfg.exp_dir = str(exp)
    config = tmp_path / "config.yaml"
    config.write_text(OmegaConf.to_yaml(cfg))
    probe = tmp_path / "probe"
    probe.mkdir()
    env = {**os.environ, PROBE_ENV: str(probe), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH")]))}
    code = ("import sys; from asrtrain.distributed.launch import launch; "
            "launch([sys.argv[1]], 2, module='test_hot_path', module_args=())")
    proc = subprocess.run([sys.executable, "-c", code, str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=500)
    records = [[json.loads(line) for line in p.read_text().splitlines()]
               if (p := probe / f"rank{r}.jsonl").is_file() else [] for r in range(2)]
    # the hot path's calls first: a collective there may also make the run fail or hang
    _assert_hot_path(backend, records, proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "model" / "final.pt").is_file()
    return records


def _hot(records: list[dict]) -> list[dict]:
    return [e for e in records if e["phase"] == "steps"]


def _calls(records: list[dict]) -> Counter:
    """(kind, name, world, thread) of every collective or communication call."""
    return Counter((e["kind"], e["name"], e.get("world"), e["thread"]) for e in records
                   if e["kind"] != "trainer")


def _assert_hot_path(backend: str, records: list[list[dict]], log: str) -> None:
    if backend == "ssgd":
        return  # the control's own assertions follow the run
    for rank, rec in enumerate(records):
        hot = _hot(rec)
        offending = Counter((e["kind"], e["name"], e.get("world"), e["thread"], e["epoch"])
                            for e in hot if e["kind"] in ("comm", "backend") or (
                                e["kind"] == "dist" and (e["world"] or e["name"] in COLLECTIVES
                                                         or e["thread"] == "main")))
        assert not offending, (f"{backend} rank {rank}: collectives between epoch boundaries "
                               f"(kind, name, world group, thread, epoch): {dict(offending)}\n"
                               f"{log}")


def _summary(records: list[list[dict]]) -> str:
    return "; ".join(
        f"rank {r}: steps {sum(e['name'] == 'step' for e in rec)}, log points "
        f"{sum(e['name'] == 'log_point' for e in rec)}, hot-path calls {dict(_calls(_hot(rec)))}"
        for r, rec in enumerate(records))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("backend", "extra"), [("adpsgd", ()),
                                                ("hadpsgd", ("trainer.per_node=1",))])
def test_gossiping_learners_meet_only_at_epoch_ends(exp: Path, tmp_path: Path, backend: str,
                                                    extra: tuple[str, ...]) -> None:
    start = time.monotonic()
    # an idle gossip thread starts a round every 5 ms: one released too early acts at once
    records = _run(exp, tmp_path, backend, *extra, "trainer.gossip_idle_s=0.005")
    print(f"{backend}: {time.monotonic() - start:.1f} s; {_summary(records)}")
    for rank, rec in enumerate(records):
        hot = _hot(rec)
        # the hot path ran (below, over the learners: steps, log points and the gossip thread's
        # own exchanges); steps are claimed, so a learner may take few, or none: one that came
        # to claim late on a loaded machine found both epochs' batches taken (ci22: 0 of 32)
        for epoch in (1, 2):
            # where the learners meet: the drain and the consensus, over all learners
            end = [e for e in rec if e["phase"] == "end" and e["epoch"] == epoch]
            names = {e["name"] for e in end}
            assert {"drain", "consensus_with_distance", "reduce_mean"} <= names, (rank, names)
            assert any(e["kind"] == "dist" and e["name"] == "all_reduce" and e["world"]
                       for e in end), rank
            # from the consensus to the epoch's metrics the gossip stays held (backend.meeting):
            # no exchange of the gossip thread for those collectives to queue behind on a link
            first = next(i for i, e in enumerate(end) if e["name"] == "average_state")
            last = next(i for i, e in enumerate(end) if e["name"] == "reduce_mean")
            during = [e for e in end[first:last + 1]
                      if e["kind"] == "dist" and e["thread"] != "main"]
            assert not during, (rank, epoch, during)
        exchanges = [e for e in hot if e["kind"] == "dist"]
        # a learner the claims left a few steps (one that started late on a loaded machine took
        # 1 of 32) may see no exchange of its gossip thread while it steps; the others must
        if sum(e["name"] == "step" for e in hot) >= 4:
            assert exchanges, (f"rank {rank}: no gossip exchange on the hot path: "
                               f"{_summary(records)}")
        assert all(e["name"] in P2P and not e["world"] and e["thread"] != "main"
                   for e in exchanges)
    steps = [sum(e["name"] == "step" for e in _hot(rec)) for rec in records]
    assert sum(steps) >= 2 * 12, steps  # two epochs of the 16 utterances' batches
    assert any(e["kind"] == "dist" for rec in records for e in _hot(rec)), _summary(records)
    log_points = sum(e["name"] == "log_point" for rec in records for e in _hot(rec))
    assert log_points >= 8, _summary(records)  # trainer.log_every=2


@pytest.mark.timeout(600)
def test_ssgd_the_control_allreduces_on_the_hot_path(exp: Path, tmp_path: Path) -> None:
    """The probe sees a hot path's collectives: ssgd's gradient allreduce every step, and its
    log points' consensus distance and metric averaging."""
    start = time.monotonic()
    records = _run(exp, tmp_path, "ssgd")
    print(f"ssgd: {time.monotonic() - start:.1f} s; {_summary(records)}")
    for rec in records:
        hot = _hot(rec)
        steps = sum(e["name"] == "step" for e in hot)
        reduces = sum(e["kind"] == "dist" and e["name"] == "all_reduce" and e["world"]
                      and e["thread"] == "main" for e in hot)
        assert steps >= 8 and reduces >= steps, _summary(records)
        log_points = sum(e["name"] == "log_point" for e in hot)
        assert log_points >= 2
        assert sum(e["name"] == "reduce_mean" for e in hot) == log_points
        assert sum(e["name"] == "consensus_distance" for e in hot) == log_points
