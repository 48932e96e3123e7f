"""The trainer's settings (``cfg.trainer``), typed and validated, with their defaults.

:class:`TrainerConfig` is the one place the trainer's defaults live: ``conf/trainer/default.yaml``
lists the same keys with the same values (``tests/test_trainer_config.py`` fails when the two
disagree), and every reader of trainer settings (the trainer loop, the learner, the distributed
backends) reads this object, never ``cfg.trainer.get(key, default)``. Its launch and backend
settings are :class:`asrtrain.distributed.config.DistributedConfig`'s, which it extends, so the
distributed package reads them without importing the trainer.

:meth:`TrainerConfig.from_config` reads the section with :func:`asrtrain.settings.read`: unknown
keys and every out-of-range value are an :class:`asrtrain.AsrtrainError` naming the key and the
value, e.g. ``trainer.learners='four'``. It needs no files and imports neither torch nor the
backends' modules, so a recipe's config can be checked before any stage runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asrtrain.distributed.config import DistributedConfig
from asrtrain.settings import (
    bad,
    boolean,
    choice,
    integer,
    number,
    opt,
    read,
    read_values,
)

#: ``trainer.precision`` values: fp32, or bf16 autocast (see :class:`TrainerConfig`).
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class SpecAugment:
    """SpecAugment's masks (Park et al., 2019): per utterance, ``freq_masks`` bands of up to
    ``freq_width`` bins and ``time_masks`` spans of up to ``time_width`` frames (at most a fifth
    of the utterance) are zeroed."""

    freq_masks: int = opt(2, integer(0))
    freq_width: int = opt(8, integer(0))
    time_masks: int = opt(2, integer(0))
    time_width: int = opt(20, integer(0))

    @classmethod
    def from_config(cls, cfg: Mapping | None,
                    prefix: str = "trainer.spec_augment") -> SpecAugment | None:
        """None for a null or empty setting (no SpecAugment), else the checked masks."""
        if cfg is None or (isinstance(cfg, Mapping) and not cfg):
            return None
        if isinstance(cfg, SpecAugment):
            return cfg
        if not isinstance(cfg, Mapping):
            raise bad(prefix, cfg, "null or a mapping of freq_masks, freq_width, time_masks, "
                                    "time_width")
        return read(cls, cfg, prefix)


def _spec_augment(key: str, value: Any) -> SpecAugment | None:
    return SpecAugment.from_config(value, key)


@dataclass(frozen=True)
class TrainerConfig(DistributedConfig):
    """Every trainer setting with its default (the keys of ``conf/trainer/default.yaml``).

    Launch and backend: :class:`DistributedConfig`'s (``backend``, ``learners``, ``nnodes``,
    ``node_rank``, ``rdzv_endpoint``, ``per_node``, ``topology``, ``delay_by_one``,
    ``timeout_s``, ``gossip_idle_s``, ``gossip_backend``, ``sync_init``, ``threads``, ``cpu``,
    ``seed``).
    Precision: ``precision``, ``fp32`` or ``bf16`` (the forward pass and the loss's inputs
    under autocast in bfloat16; weights, gradients, optimizer state and the loss in fp32). A
    device whose kernels cannot (a CPU without AVX-512) is refused before training, not here
    (this module does not import torch): :func:`asrtrain.models.precision.check_precision`.
    Optimisation: ``epochs``, ``optimizer`` (adam | sgd), ``lr``, ``momentum`` and ``nesterov``
    (sgd), ``weight_decay``, ``grad_clip`` (max gradient norm; 0: none), the LR schedule
    (:class:`asrtrain.train.schedule.LRSchedule`: ``warmup_epochs``, ``warmup_start``,
    ``anneal_start_epoch``, ``anneal_factor``), ``log_every`` steps, ``spec_augment``.
    Checkpoints: ``keep_checkpoints``, the epoch checkpoints kept (the last N, with the
    learners' optimizer states; the models of the ``keep_best`` epochs of the lowest dev loss
    and ``final.pt`` are kept besides, for ``decode.checkpoint`` best or average; 0: every
    epoch). ``early_stop_patience``: stop after this many epochs in a row without a new lowest
    dev loss (0: train every epoch).
    Data: CTC batches of ``batch_frames`` padded frames per learner, utterances of at most
    ``max_utt_frames``; frame CE (hybrid) batches of ``batch_chunks`` chunks of ``chunk`` frames,
    shuffled in blocks of ``block_utts`` utterances; ``chunk_data``: ``resident`` (the features
    written once into a chunk store under the exp dir and memory-mapped by every learner of a
    machine, so it holds one copy; copied onto a GPU where they fit; batches gathered:
    :mod:`asrtrain.train.resident`, :mod:`asrtrain.train.store`) or ``stream`` (read from the
    arks every epoch, for want of disk for the store); both give the same batches.
    """

    precision: str = opt("fp32", choice(*PRECISIONS))
    epochs: int = opt(12, integer(1))
    batch_frames: int = opt(6000, integer(1))
    max_utt_frames: int = opt(3000, integer(1))
    optimizer: str = opt("adam", choice("adam", "sgd"))
    lr: float = opt(1.0e-3, number(0.0))
    momentum: float = opt(0.9, number(0.0, 1.0))
    nesterov: bool = opt(False, boolean)
    weight_decay: float = opt(0.0, number(0.0))
    grad_clip: float = opt(5.0, number(0.0))
    warmup_epochs: float = opt(0.5, number(0.0))
    warmup_start: float = opt(0.1, number(0.0, 1.0))
    anneal_start_epoch: float = opt(6.0, number(0.0))
    anneal_factor: float = opt(0.7071, number(0.0, 1.0, low_open=True))
    log_every: int = opt(20, integer(1))
    keep_checkpoints: int = opt(2, integer(0))
    keep_best: int = opt(5, integer(1))
    early_stop_patience: int = opt(0, integer(0))
    spec_augment: SpecAugment | None = opt(None, _spec_augment)
    chunk: int = opt(21, integer(1))
    batch_chunks: int = opt(128, integer(1))
    block_utts: int = opt(256, integer(1))
    chunk_data: str = opt("resident", choice("resident", "stream"))

    @classmethod
    def from_config(cls, cfg: Mapping | TrainerConfig | None) -> TrainerConfig:
        """The settings of ``cfg`` (e.g. ``cfg.trainer``), the defaults for the keys it lacks.

        Raises:
            AsrtrainError: an unknown key, or a value of the wrong type or range (the message
                names ``trainer.<key>`` and the value).
        """
        if isinstance(cfg, TrainerConfig):
            return cfg
        return read(cls, cfg, "trainer")

    @classmethod
    def check_section(cls, cfg: Mapping | None, prefix: str) -> dict[str, Any]:
        """The checked values of a partial section (e.g. ``hybrid.trainer``, which overrides
        ``trainer``), errors naming ``<prefix>.<key>``.

        Raises:
            AsrtrainError: as :meth:`from_config`, but without the checks across keys.
        """
        return read_values(cls, cfg, prefix)
