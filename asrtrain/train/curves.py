"""Training curves: TensorBoard event files in the model dir, and the same curves as a PNG.

Learner 0 writes the events into ``train/<model>/`` itself, so each training run is one
TensorBoard run and ``tensorboard --logdir exp/<recipe>/train`` shows every model side by side
(a run moved aside by a fresh start, ``<model>.before-<time>``, shows as its own run). The x axis
is learner 0's step. A resumed run opens its writer with ``purge_step`` just past the step it
resumes from (that step's epoch points are kept), so what a killed run wrote after its last
checkpoint is dropped, not drawn twice.

Tags (scalars): ``loss/train`` (every ``log_every`` steps), ``loss/dev`` and
``loss/train_epoch`` (per epoch), ``dev/frame_accuracy`` (hybrid) or ``dev/unit_error_rate``
(CTC), ``lr``, ``frames_per_s/learner_<rank>`` (this epoch so far) and, in lockstep (``ssgd``,
one learner), ``frames_per_s/mean``: there the step figures are means over learners (an
allreduce where they meet anyway). The gossiping backends keep collectives off the hot path:
each learner writes its own step figures, learner ``r`` > 0 into ``learner_<r>/`` beside
learner 0's, with ``gossip/exchanges_per_s`` and ``gossip/exchanges_per_step`` (its pairwise
exchanges since the last point); ``consensus/distance`` (mean over learners of
``||x_i - x_bar|| / ||x_bar||``) is a point per epoch, measured at its end. At the end of training
:func:`plot_curves` reads the event files back and draws them into ``curves.png`` for people
without TensorBoard.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

from asrtrain import AsrtrainError
from asrtrain.fileio import atomic_open

log = logging.getLogger(__name__)

#: The PNG's panels: a title and the tags drawn in it, a prefix ending in ``/`` for the tags
#: under it (empty panels are left out).
PANELS = (("loss", ("loss/",)), ("dev set", ("dev/",)), ("learning rate", ("lr",)),
          ("frames/s per learner", ("frames_per_s/",)),
          ("consensus distance", ("consensus/",)),
          ("gossip exchanges/s", ("gossip/exchanges_per_s",)),
          ("gossip exchanges per step", ("gossip/exchanges_per_step",)))


class Curves:
    """Learner 0's event writer for one training run in ``run_dir``."""

    def __init__(self, run_dir: str | Path, start_step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise AsrtrainError(f"tensorboard is not installed ({e}): pip install -e . "
                                "installs it") from e
        self.writer = SummaryWriter(str(run_dir), purge_step=start_step + 1, flush_secs=30)

    def add(self, step: int, scalars: Mapping[str, float]) -> None:
        """Write ``scalars`` ({tag: value}) at ``step``; non-finite values are left out."""
        for tag, value in scalars.items():
            if math.isfinite(value):
                self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve of the event files in ``run_dir``: {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})  # 0: keep every point
    quiet = logging.getLogger("tensorboard")  # it logs each file it reads and each purge
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        acc.Reload()
    finally:
        quiet.setLevel(level)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def plot_curves(run_dir: str | Path, png: str | Path, title: str = "") -> Path | None:
    """Draw the curves of ``run_dir``'s event files into ``png`` (atomically); None if there
    are none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read_scalars(run_dir)
    panels = [(name, {t: v for t, v in sorted(curves.items()) if _shown_in(t, prefixes)})
              for name, prefixes in PANELS]
    panels = [(name, tags) for name, tags in panels if tags]
    if not panels:
        return None
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(12, 3.2 * rows), squeeze=False)
    for ax, (name, tags) in zip(axes.flat, panels, strict=False):
        _draw(ax, name, tags)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    _fixed_margins(fig, rows, bool(title))
    with atomic_open(png, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return Path(png)


def _shown_in(tag: str, prefixes: tuple[str, ...]) -> bool:
    """A prefix that ends in ``/`` takes the tags under it, any other the tag itself
    (``gossip/exchanges_per_s`` is not ``gossip/exchanges_per_step``)."""
    return any(tag.startswith(p) if p.endswith("/") else tag == p for p in prefixes)


#: The margins around the panels, in inches: room for the tick labels, a panel's title above
#: it and its x label below, and the figure's title. Fixed, not ``tight_layout``'s: measuring
#: every text's extent cost ~1 s of a 2.8 s figure, at the end of every training run.
MARGIN_IN = {"left": 0.75, "right": 0.15, "bottom": 0.55, "top": 0.35, "title": 0.35,
             "between_rows": 0.8, "between_columns": 0.85}


def _fixed_margins(fig, rows: int, title: bool) -> None:
    width, height = fig.get_size_inches()
    m = MARGIN_IN
    top = m["top"] + (m["title"] if title else 0.0)
    panel_h = (height - top - m["bottom"] - m["between_rows"] * (rows - 1)) / rows
    panel_w = (width - m["left"] - m["right"] - m["between_columns"]) / 2
    fig.subplots_adjust(left=m["left"] / width, right=1 - m["right"] / width,
                        bottom=m["bottom"] / height, top=1 - top / height,
                        hspace=m["between_rows"] / panel_h,
                        wspace=m["between_columns"] / panel_w)


def _draw(ax, name: str, tags: Mapping[str, list[tuple[int, float]]]) -> None:
    for tag, points in tags.items():
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3,
                label=tag)
    if name == "consensus distance" and all(
            v > 0 for points in tags.values() for _, v in points):
        ax.set_yscale("log")
    ax.set_title(name, y=1.0)  # placed, not measured against the tick labels (~0.1 s a panel)
    ax.set_xlabel("step (learner 0)")
    ax.grid(alpha=0.3)
    if len(tags) <= 10:  # one line per learner of a large run needs no legend of its own
        ax.legend(fontsize=7)
