"""TrainerConfig: the trainer's defaults in one place, and every bad setting named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
from omegaconf import OmegaConf

from asrtrain import AsrtrainError
from asrtrain.train.config import SpecAugment, TrainerConfig

REPO = Path(__file__).resolve().parents[1]


def test_yaml_defaults_are_the_dataclass_defaults() -> None:
    yaml = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "trainer" / "default.yaml"))
    fields = set(TrainerConfig.__dataclass_fields__)
    assert set(yaml) == fields, (sorted(set(yaml) - fields), sorted(fields - set(yaml)))
    assert TrainerConfig.from_config(yaml) == TrainerConfig()


def _trainer_sections() -> list[tuple[str, dict]]:
    out = []
    for path in sorted([*REPO.glob("recipes/*/recipe.yaml"), *REPO.glob("conf/hybrid/*.yaml")]):
        section = OmegaConf.to_container(OmegaConf.load(path)).get("trainer")
        if section:
            out.append((str(path.relative_to(REPO)), section))
    return out


@pytest.mark.parametrize(("where", "section"), _trainer_sections())
def test_recipe_and_hybrid_trainer_settings_are_valid(where: str, section: dict) -> None:
    cfg = TrainerConfig.from_config(section)
    for key, value in section.items():
        got = getattr(cfg, key)
        if isinstance(got, SpecAugment):
            got = {k: getattr(got, k) for k in value}
        assert got == value, (where, key)


def test_settings_are_typed_and_defaults_fill_the_rest() -> None:
    cfg = TrainerConfig.from_config({"backend": "hadpsgd", "learners": 4, "per_node": None,
                                     "timeout_s": 5, "spec_augment": {"freq_masks": 1}})
    assert cfg.backend == "hadpsgd" and cfg.learners == 4
    assert cfg.per_node is None
    assert cfg.timeout_s == 5.0 and isinstance(cfg.timeout_s, float)
    assert cfg.spec_augment == SpecAugment(freq_masks=1)
    assert cfg.seed == TrainerConfig().seed and cfg.epochs == TrainerConfig().epochs
    assert TrainerConfig.from_config(None) == TrainerConfig()
    assert TrainerConfig.from_config({"spec_augment": {}}).spec_augment is None
    assert TrainerConfig.from_config(cfg) is cfg


@pytest.mark.parametrize(("settings", "message"), [
    ({"learners": "four"}, "trainer.learners='four': expected an integer >= 1"),
    ({"learners": True}, "trainer.learners=True: expected an integer"),
    ({"epochs": 0}, "trainer.epochs=0: expected an integer >= 1"),
    ({"batch_frames": 0}, "trainer.batch_frames=0: expected an integer >= 1"),
    ({"lr": -1}, "trainer.lr=-1.0: expected a number >= 0"),
    ({"seed": -1}, "trainer.seed=-1: expected an integer >= 0"),
    ({"timeout_s": 0}, "trainer.timeout_s=0.0: expected a number > 0"),
    ({"momentum": 1.5}, "trainer.momentum=1.5: expected a number >= 0 and <= 1"),
    ({"backend": "nope"}, "trainer.backend='nope': expected one of adpsgd, hadpsgd, ssgd"),
    ({"topology": "star"}, "trainer.topology='star': expected one of ring, random_ring"),
    ({"optimizer": "lamb"}, "trainer.optimizer='lamb': expected one of adam, sgd"),
    ({"delay_by_one": "yes"}, "trainer.delay_by_one='yes': expected true or false"),
    ({"rdzv_endpoint": "node0"}, "trainer.rdzv_endpoint='node0': expected host:port"),
    ({"per_node": -2}, "trainer.per_node=-2: expected an integer >= 1"),
    ({"nnodes": 2, "node_rank": 2}, "trainer.node_rank=2: expected a node number below"),
    ({"lerners": 4}, "trainer.lerners: unknown setting; known: anneal_factor"),
    ({"spec_augment": {"freq_masks": -1}}, "trainer.spec_augment.freq_masks=-1"),
    ({"spec_augment": {"masks": 2}}, "trainer.spec_augment.masks: unknown setting"),
    ({"spec_augment": 3}, "trainer.spec_augment=3: expected null or a mapping"),
])
def test_bad_settings_are_named(settings: dict, message: str) -> None:
    with pytest.raises(AsrtrainError) as e:
        TrainerConfig.from_config(settings)
    assert message in str(e.value)


def test_checking_a_config_imports_no_torch() -> None:
    # The pipeline checks the trainer settings before any stage runs: that must stay cheap.
    code = ("import sys; from asrtrain.train.config import TrainerConfig; "
            "TrainerConfig.from_config({'backend': 'hadpsgd', 'topology': 'ring'}); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("override", "named"), [
    ("trainer.learners=four", "trainer.learners='four': expected an integer >= 1"),
    ("trainer.epochs=0", "trainer.epochs=0: expected an integer >= 1"),
    ("trainer.epochs=-1", "trainer.epochs=-1: expected an integer >= 1"),
    ("trainer.batch_frames=0", "trainer.batch_frames=0: expected an integer >= 1"),
    ("hybrid.trainer.batch_chunks=0", "hybrid.trainer.batch_chunks=0: expected an integer >= 1"),
    ("trainer.keep_checkpoints=-1", "trainer.keep_checkpoints=-1: expected an integer >= 0"),
    ("+trainer.unknown_key=1", "trainer.unknown_key: unknown setting; known: anneal_factor"),
    ("+hybrid.trainer.unknown_key=1", "hybrid.trainer.unknown_key: unknown setting; known: "),
])
def test_the_cli_refuses_a_bad_trainer_setting_in_one_line(tmp_path: Path, override: str,
                                                           named: str) -> None:
    exp = tmp_path / "exp"
    proc = forked_cli.run("run", "recipes/tiny",
                          f"exp_dir={exp}", override, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"asrtrain: error: {named}"), lines
    if "unknown setting" in named:
        assert "keep_checkpoints" in lines[0] and "batch_frames" in lines[0]  # the valid keys
    assert not exp.exists()  # refused before anything on disk moved
