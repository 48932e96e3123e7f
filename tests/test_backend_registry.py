"""A fourth backend is one new file: this one, defined and registered here, trains real gloo
learners through the registry and build_backend, without a change anywhere in the package.

The toy backend is local SGD (Stich, "Local SGD converges fast and communicates little", ICLR
2019): every learner steps on its own gradients, and every ``K`` steps the learners replace their
models by the average of all models. The learners are separate processes: they import this module
(``--plugin``) to register it, as a backend module in asrtrain/distributed/backends/ would be
imported by the registry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import synthetic  # bench/synthetic.py (conftest puts bench/ on the path)
import torch

from asrtrain import AsrtrainError
from asrtrain.distributed.backend import DistributedBackend
from asrtrain.distributed.registry import backend_class, backend_names, register_backend
from asrtrain.train.config import TrainerConfig

NAME = "test_local_sgd"
K = 4  # steps between averagings


@register_backend(NAME)
class LocalSGDBackend(DistributedBackend):
    """Local SGD:  x_i <- x_i - lr * g_i  every step;  x_i <- (1/N) sum_j x_j  every K steps."""

    lockstep = "all"

    def attach(self) -> None:
        self._global = 0
        self.averagings = 0

    def after_step(self, step: int, batch_samples: int) -> None:
        self._local_samples += int(batch_samples)
        self._global += self.comm.allreduce_int(batch_samples, "sample count")
        if (step + 1) % K == 0:
            assert self.model is not None
            with self.model_lock:
                self.model.load_state_dict(self.average_state())
            self.averagings += 1

    def global_samples(self) -> int:
        return self.start_samples + self._global


def test_the_registry_knows_the_new_backend() -> None:
    assert {"ssgd", "adpsgd", "hadpsgd", NAME} <= set(backend_names())
    assert backend_class(NAME) is LocalSGDBackend and LocalSGDBackend.name == NAME
    assert TrainerConfig.from_config({"backend": NAME}).backend == NAME
    with pytest.raises(AsrtrainError, match="registered twice"):
        register_backend(NAME)(type("Other", (DistributedBackend,), {}))
    with pytest.raises(AsrtrainError, match=r"trainer.backend='nope': expected one of .*ssgd"):
        backend_class("nope")


@pytest.mark.timeout(120)
def test_a_backend_defined_outside_the_package_trains(tmp_path: Path) -> None:
    learners, steps = 3, 10 * K
    codes = synthetic.run_local(
        tmp_path, learners, ["--plugin", __name__, "--backend", NAME, "--steps", str(steps),
                             "--batch", "36", "--lr", "0.1", "--decay-samples", "1e9"], 90)
    assert codes == dict.fromkeys(range(learners), 0), [
        p.read_text() for p in tmp_path.glob("error*")]
    stats = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(learners)]
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(learners)]
    assert all(s["backend"] == NAME and s["world_size"] == learners for s in stats)
    assert all(s["global_samples"] == steps * 36 for s in stats)
    # Each learner saw its own third of every batch, yet the models end equal: they averaged.
    for st in states[1:]:
        for k, v in states[0]["final"].items():
            assert torch.equal(st["final"][k], v), k
    consensus = torch.load(tmp_path / "consensus.pt")
    x, y = synthetic.make_data(256, 8, 0)
    model = synthetic.make_model(8, 16, 0)
    start = float(torch.nn.functional.mse_loss(model(x), y).detach())
    model.load_state_dict(consensus)
    assert float(torch.nn.functional.mse_loss(model(x), y).detach()) < 0.7 * start
