"""What a training run reads, checked before it changes anything (issue 26: check, then move).

A forced or changed training run moves the finished run's checkpoints aside
(:func:`asrtrain.train.run.prepare_dir`). Everything the learners would refuse at their start must
be refused before that, in the stage's own process: :func:`check_inputs` builds the run's task as
every learner does (the data dirs, the units or the alignments, the fMLLR features and i-vectors
the input appends: the very constructors, so the same errors), reads the last entry of every ark
its tables point into (an ark cut short is found now, not halfway through epoch 1), and builds
the model and its optimizer on the ``meta`` device (no memory, no data): a model setting that
cannot be built is an error too. :func:`check_finite` refuses a NaN or infinite number anywhere in
a config section, in one line naming the key.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from asrtrain import AsrtrainError

log = logging.getLogger("asrtrain")

#: ``path:offset`` of a Kaldi scp entry, with an optional ``[rows]`` or ``[rows,cols]`` range.
_ARK_ENTRY = re.compile(r"^(?P<path>.+):(?P<offset>\d+)(?:\[[^\]]*\])?$")


def check_finite(section: Any, prefix: str) -> None:
    """Raise naming ``<prefix>.<key>`` when a number in ``section`` (a config node or plain
    data, nested) is NaN or infinite: no setting of a model or trainer means that."""
    if isinstance(section, DictConfig) or OmegaConf.is_list(section):
        section = OmegaConf.to_container(section, resolve=True)
    if isinstance(section, Mapping):
        for key, value in section.items():
            check_finite(value, f"{prefix}.{key}")
    elif isinstance(section, list | tuple):
        for i, value in enumerate(section):
            check_finite(value, f"{prefix}[{i}]")
    elif isinstance(section, float) and not math.isfinite(section):
        raise AsrtrainError(f"{prefix}={section!r}: expected a finite number")


def check_ark_ends(table: Mapping[str, str], scp: str | Path, what: str) -> None:
    """Read the last entry of every ark ``table`` (utterance or speaker -> ``ark:offset``, as
    ``scp`` lists them) points into: an ark that is missing, cut short or rewritten since the
    scp was written is an error naming ``scp``, the entry, the ark's size and ``what`` to
    rerun. Entries that are not ``path:offset`` are read when used."""
    import kaldiio

    last: dict[str, tuple[int, str, str]] = {}
    for key, spec in table.items():
        m = _ARK_ENTRY.match(str(spec))
        if m is None:
            continue
        offset = int(m.group("offset"))
        if m.group("path") not in last or offset > last[m.group("path")][0]:
            last[m.group("path")] = (offset, key, str(spec))
    for ark, (offset, key, spec) in sorted(last.items()):
        try:
            size = os.path.getsize(ark)
        except OSError as e:
            raise AsrtrainError(f"{scp}: {key}: cannot read {ark}: {e.strerror}; {what}") from e
        try:
            kaldiio.load_mat(spec)
        except Exception as e:  # noqa: BLE001 - whatever the reader says, the ark is unusable
            reason = (f"the ark ends at byte {size}, before the entry" if offset >= size else
                      f"the ark ends at byte {size}; cut short or rewritten? "
                      f"({type(e).__name__}{': ' + str(e).splitlines()[0] if str(e) else ''})")
            raise AsrtrainError(f"{scp}: {key}: cannot read {spec}: {reason}; {what}") from e


def _check_tables(task) -> None:
    """The arks behind every table ``task``'s data sets read."""
    for data in (task.train_set, task.dev_set):
        reader = data.reader
        check_ark_ends(reader.data.feats, reader.feats_scp,
                       "rerun the features stage (--force features)")
        for stream in reader.streams:
            stage = "ivectors" if stream.name == "ivector" else "align"
            check_ark_ends(stream.table, stream.scp,
                           f"rerun the stage that wrote it (--force {stage})")
        ali = getattr(data, "ali", None)
        if ali is not None:
            check_ark_ends(ali, data.ali_dir / "ali.scp", "rerun the align stage (--force align)")


def check_inputs(cfg: DictConfig) -> None:
    """Check everything the training run of ``cfg`` (the resolved config a learner reads, with
    ``exp_dir``) needs before it starts, without writing anything.

    Raises:
        AsrtrainError: one line naming the file or setting at fault.
    """
    import torch

    from asrtrain.models.registry import build_model
    from asrtrain.train.chunks import read_alignments
    from asrtrain.train.config import TrainerConfig
    from asrtrain.train.tasks import build_task
    from asrtrain.train.trainer import build_optimizer

    check_finite(cfg.model, "model")
    tcfg = TrainerConfig.from_config(cfg.trainer)
    alignments = cfg.model.get("alignments")  # a hybrid model's: read whole by its task
    for ali_dir in (alignments.values() if alignments else ()):
        table, _ = read_alignments(ali_dir)
        check_ark_ends(table, Path(ali_dir) / "ali.scp", "rerun the align stage (--force align)")
    quiet = logging.getLogger("asrtrain.train")  # what the data sets warn of, learner 0 says
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        task = build_task(cfg)
    finally:
        quiet.setLevel(level)
    _check_tables(task)
    try:
        with torch.device("meta"):
            model = build_model(cfg.model, task.input_dim, task.output_dim)
            build_optimizer(tcfg, model.parameters())
    except AsrtrainError:
        raise
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        raise AsrtrainError(f"model {OmegaConf.to_container(cfg.model, resolve=True)}: cannot "
                            f"build it for {task.input_dim} inputs and {task.output_dim} "
                            f"outputs: {e}") from e
    log.info("training inputs checked: %d training and %d dev %s", task.samples_per_epoch,
             len(task.dev_set), "utterances" if task.name == "ctc" else "chunks")
