"""launch(): learners started through torchrun's launcher, as the trainer's recipe stage does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asrtrain import AsrtrainError
from asrtrain.distributed.launch import launch, torchrun_args

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = dict(module="synthetic", module_args=())  # bench/synthetic.py


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The learners are new Python processes: they must find the package without installing it,
    # and the synthetic learner in bench/.
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "bench")]))


@pytest.mark.timeout(120)
def test_launch_runs_learners(tmp_path: Path) -> None:
    launch(["--backend", "hadpsgd", "--per-node", "1", "--steps", "8", "--out", str(tmp_path)],
           2, **SYNTHETIC)
    stats = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [s["rank"] for s in stats] == [0, 1]
    assert all(s["world_size"] == 2 and s["backend"] == "hadpsgd" for s in stats)
    assert all(s["threads"] == 1 for s in stats)  # one CPU thread a learner by default
    assert "spectral gap" in stats[0]["describe"]
    assert (tmp_path / "consensus.pt").exists()


@pytest.mark.timeout(120)
def test_launch_names_the_learner_that_died(tmp_path: Path) -> None:
    with pytest.raises(AsrtrainError, match=r"learner rank 1 failed first \(exit code 3"):
        launch(["--backend", "ssgd", "--steps", "500", "--sleep", "0.01", "--die-rank", "1",
                "--die-step", "3", "--out", str(tmp_path)], 3, **SYNTHETIC)


def test_multi_node_settings_are_passed_to_torchrun() -> None:
    args = torchrun_args(["trainer.backend=hadpsgd"], 4, nnodes=2, node_rank=1,
                         rdzv_endpoint="node0:29500")
    assert args[:3] == ["--nproc-per-node=4", "--max-restarts=0", "--monitor-interval=0.1"]
    assert "--nnodes=2" in args and "--node-rank=1" in args
    assert "--rdzv-endpoint=node0:29500" in args and "--rdzv-backend=static" in args
    assert args[-4:] == ["-m", "asrtrain.cli", "train", "trainer.backend=hadpsgd"]
    assert "--standalone" in torchrun_args([], 2)
    with pytest.raises(AsrtrainError, match="rdzv_endpoint"):
        torchrun_args([], 2, nnodes=2, node_rank=0)
    with pytest.raises(AsrtrainError, match="node_rank"):
        torchrun_args([], 2, nnodes=2, node_rank=2, rdzv_endpoint="h:1")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("node_rank, said", [
    (1, "node 0 did not answer within 3 s"),
    (0, "the other 1 node(s) did not all join within 3 s")])
def test_a_node_alone_at_the_rendezvous_is_one_line_naming_who_is_missing(
        tmp_path: Path, node_rank: int, said: str) -> None:
    port = _free_port()
    with pytest.raises(AsrtrainError) as e:
        launch(["--backend", "ssgd", "--steps", "2", "--out", str(tmp_path)], 1, nnodes=2,
               node_rank=node_rank, rdzv_endpoint=f"127.0.0.1:{port}", rdzv_timeout_s=3,
               **SYNTHETIC)
    line = str(e.value)
    assert line.startswith(f"node {node_rank} of 2: the rendezvous at 127.0.0.1:{port} failed")
    assert said in line and "\n" not in line
    assert not list(tmp_path.glob("rank*.json"))  # no learner ran


def test_rendezvous_event_names_are_torchs_without_its_stack_walk() -> None:
    """launch() swaps torchrun's ``dynamic_rendezvous.get_method_name`` (inspect.stack(), which
    reads the source of every frame) for a frame lookup: the same names, at every depth, and
    torch still calls it where the swap reaches it."""
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from asrtrain.distributed.launch import cheap_rendezvous_names, method_name

    def recorder(depth: int) -> tuple[str, str]:   # as _record calls it: from a method
        return dynamic_rendezvous.get_method_name(depth), method_name(depth)

    def caller(depth: int) -> tuple[str, str]:
        return recorder(depth)

    for depth in (1, 2, 3, 10_000):   # 0 is the function itself
        torch_name, ours = caller(depth)
        assert ours == torch_name, (depth, ours, torch_name)
    assert caller(2)[1] == "caller" and caller(10_000)[1] == "no_method_name"
    source = inspect.getsource(dynamic_rendezvous)
    assert source.count("get_method_name()") >= 3, "torch no longer names its events so"
    before = dynamic_rendezvous.get_method_name
    with cheap_rendezvous_names():
        assert dynamic_rendezvous.get_method_name is method_name
    assert dynamic_rendezvous.get_method_name is before
