"""The trainer's settings (``cfg.trainer``), typed and validated, with their defaults.

:class:`TrainerConfig` is the one place the trainer's defaults live: ``conf/trainer/default.yaml``
lists the same keys with the same values (``tests/test_trainer_config.py`` fails when the two
disagree), and every reader of trainer settings (the trainer loop, the learner, the distributed
backends) reads this object, never ``cfg.trainer.get(key, default)``.

:meth:`TrainerConfig.from_config` rejects unknown keys and every out-of-range value with an
:class:`asrtrain.AsrtrainError` naming the key and the value, e.g. ``trainer.learners='four'``.
It needs no files and imports neither torch nor the backends' modules (the known backends are
listed by :func:`asrtrain.distributed.registry.backend_names` without importing them), so a
recipe's config can be checked before any stage runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from asrtrain import AsrtrainError

Parse = Callable[[str, Any], Any]

#: ``trainer.precision`` values: fp32, or bf16 autocast (see :class:`TrainerConfig`).
PRECISIONS = ("fp32", "bf16")


def _bad(key: str, value: Any, expected: str) -> AsrtrainError:
    return AsrtrainError(f"{key}={value!r}: expected {expected}")


def _int(low: int | None = None) -> Parse:
    def parse(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(key, value, "an integer" + (f" >= {low}" if low is not None else ""))
        if low is not None and value < low:
            raise _bad(key, value, f"an integer >= {low}")
        return value
    return parse


def _float(low: float, high: float | None = None, low_open: bool = False) -> Parse:
    lo = f"> {low:g}" if low_open else f">= {low:g}"
    expected = f"a number {lo}" + (f" and <= {high:g}" if high is not None else "")

    def parse(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad(key, value, expected)
        value = float(value)
        if not math.isfinite(value):  # NaN compares false with every bound: refused by name
            raise _bad(key, value, "a finite " + expected[2:])
        if value < low or (low_open and value == low) or (high is not None and value > high):
            raise _bad(key, value, expected)
        return value
    return parse


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(key, value, "true or false")
    return value


def _choice(names: Callable[[], tuple[str, ...]]) -> Parse:
    def parse(key: str, value: Any) -> str:
        known = names()
        if value not in known:
            raise _bad(key, value, "one of " + ", ".join(known))
        return str(value)
    return parse


def _optional(parse: Parse, *empty: Any) -> Parse:
    """``parse``, or None for None and the ``empty`` values (older configs wrote 0 or '')."""
    def parse_optional(key: str, value: Any) -> Any:
        if value is None or any(value == e and type(value) is type(e) for e in empty):
            return None
        return parse(key, value)
    return parse_optional


def _endpoint(key: str, value: Any) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise _bad(key, value, "host:port of node 0")
    return value


def _backends() -> tuple[str, ...]:
    from asrtrain.distributed.registry import backend_names

    return backend_names()


def _topologies() -> tuple[str, ...]:
    from asrtrain.distributed.topology import SCHEMES

    return SCHEMES


def _opt(default: Any, parse: Parse) -> Any:
    """A field with its default and the parser that checks a configured value."""
    return field(default=default, metadata={"parse": parse})


def _parse_fields(cls: type, cfg: Mapping | None, prefix: str) -> dict[str, Any]:
    """``cfg``'s values checked by the parsers of ``cls``'s fields; unknown keys are errors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in dict((cfg or {}).items()).items():
        if key not in fields:
            raise AsrtrainError(f"{prefix}.{key}: unknown setting; known: "
                                f"{', '.join(sorted(fields))}")
        values[key] = fields[key].metadata["parse"](f"{prefix}.{key}", value)
    return values


@dataclass(frozen=True)
class SpecAugment:
    """SpecAugment's masks (Park et al., 2019): per utterance, ``freq_masks`` bands of up to
    ``freq_width`` bins and ``time_masks`` spans of up to ``time_width`` frames (at most a fifth
    of the utterance) are zeroed."""

    freq_masks: int = _opt(2, _int(0))
    freq_width: int = _opt(8, _int(0))
    time_masks: int = _opt(2, _int(0))
    time_width: int = _opt(20, _int(0))

    @classmethod
    def from_config(cls, cfg: Mapping | None,
                    prefix: str = "trainer.spec_augment") -> SpecAugment | None:
        """None for a null or empty setting (no SpecAugment), else the checked masks."""
        if cfg is None or (isinstance(cfg, Mapping) and not cfg):
            return None
        if isinstance(cfg, SpecAugment):
            return cfg
        if not isinstance(cfg, Mapping):
            raise _bad(prefix, cfg, "null or a mapping of freq_masks, freq_width, time_masks, "
                                    "time_width")
        return cls(**_parse_fields(cls, cfg, prefix))


def _spec_augment(key: str, value: Any) -> SpecAugment | None:
    return SpecAugment.from_config(value, key)


@dataclass(frozen=True)
class TrainerConfig:
    """Every trainer setting with its default (the keys of ``conf/trainer/default.yaml``).

    Launch: ``learners`` per node (torchrun ``--nproc-per-node``), ``nnodes`` machines, this
    machine's ``node_rank`` and node 0's ``rdzv_endpoint`` (host:port) for multi-node runs.
    Backend (:mod:`asrtrain.distributed`): ``backend`` (a registered name), ``per_node`` (hadpsgd:
    learners per super-learner; None: the learners of a machine), the gossip ``topology``,
    ``delay_by_one``, ``gossip_idle_s`` (the pause between gossip rounds when no step was taken),
    ``gossip_backend`` (``gloo``; ``nccl``: between GPUs, never run here, docs/architecture.md),
    ``timeout_s`` (every blocking wait), ``sync_init`` (start all learners from learner 0's
    model), ``threads`` (torch CPU threads per learner; 0: one), ``cpu`` (train on CPU even where
    CUDA is available), ``seed`` (the initial model, the batch order, SpecAugment draws and the
    randomized gossip ring).
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

    backend: str = _opt("ssgd", _choice(_backends))
    learners: int = _opt(1, _int(1))
    nnodes: int = _opt(1, _int(1))
    node_rank: int = _opt(0, _int(0))
    rdzv_endpoint: str | None = _opt(None, _optional(_endpoint, ""))
    per_node: int | None = _opt(None, _optional(_int(1), 0, ""))
    topology: str = _opt("random_ring", _choice(_topologies))
    delay_by_one: bool = _opt(False, _bool)
    timeout_s: float = _opt(60.0, _float(0.0, low_open=True))
    gossip_idle_s: float = _opt(0.1, _float(0.0, low_open=True))
    gossip_backend: str = _opt("gloo", _choice(lambda: ("gloo", "nccl")))
    sync_init: bool = _opt(True, _bool)
    threads: int = _opt(0, _int(0))
    cpu: bool = _opt(False, _bool)
    seed: int = _opt(1, _int(0))
    precision: str = _opt("fp32", _choice(lambda: PRECISIONS))
    epochs: int = _opt(12, _int(1))
    batch_frames: int = _opt(6000, _int(1))
    max_utt_frames: int = _opt(3000, _int(1))
    optimizer: str = _opt("adam", _choice(lambda: ("adam", "sgd")))
    lr: float = _opt(1.0e-3, _float(0.0))
    momentum: float = _opt(0.9, _float(0.0, 1.0))
    nesterov: bool = _opt(False, _bool)
    weight_decay: float = _opt(0.0, _float(0.0))
    grad_clip: float = _opt(5.0, _float(0.0))
    warmup_epochs: float = _opt(0.5, _float(0.0))
    warmup_start: float = _opt(0.1, _float(0.0, 1.0))
    anneal_start_epoch: float = _opt(6.0, _float(0.0))
    anneal_factor: float = _opt(0.7071, _float(0.0, 1.0, low_open=True))
    log_every: int = _opt(20, _int(1))
    keep_checkpoints: int = _opt(2, _int(0))
    keep_best: int = _opt(5, _int(1))
    early_stop_patience: int = _opt(0, _int(0))
    spec_augment: SpecAugment | None = _opt(None, _spec_augment)
    chunk: int = _opt(21, _int(1))
    batch_chunks: int = _opt(128, _int(1))
    block_utts: int = _opt(256, _int(1))
    chunk_data: str = _opt("resident", _choice(lambda: ("resident", "stream")))

    @classmethod
    def from_config(cls, cfg: Mapping | TrainerConfig | None) -> TrainerConfig:
        """The settings of ``cfg`` (e.g. ``cfg.trainer``), the defaults for the keys it lacks.

        Raises:
            AsrtrainError: an unknown key, or a value of the wrong type or range (the message
                names ``trainer.<key>`` and the value).
        """
        if isinstance(cfg, TrainerConfig):
            return cfg
        out = cls(**cls.check_section(cfg, "trainer"))
        if out.node_rank >= out.nnodes:
            raise _bad("trainer.node_rank", out.node_rank,
                       f"a node number below trainer.nnodes={out.nnodes}")
        return out

    @classmethod
    def check_section(cls, cfg: Mapping | None, prefix: str) -> dict[str, Any]:
        """The checked values of a partial section (e.g. ``hybrid.trainer``, which overrides
        ``trainer``), errors naming ``<prefix>.<key>``.

        Raises:
            AsrtrainError: as :meth:`from_config`, but without the checks across keys.
        """
        return _parse_fields(cls, cfg, prefix)
