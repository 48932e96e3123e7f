"""Logging set-up of every command (``asrtrain run``, a learner, ``asrtrain simulate``): lines on
stderr that never land inside a progress bar, and the stage-log-only records kept off the
console. A base-layer module (docs/architecture.md, "Layers"), so any command sets logging up
without importing another command's module."""

from __future__ import annotations

import logging
import sys


class BarSafeHandler(logging.StreamHandler):
    """Writes log lines to stderr through tqdm, so a line never lands in the middle of a
    progress bar: the bar is cleared, the line written, the bar drawn again below it."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def plural(n: int, noun: str) -> str:
    """``n`` and the noun, in the plural unless ``n`` is 1 ("1 job", "4 jobs")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def setup_logging(verbose: bool) -> None:
    """INFO (DEBUG when ``verbose``) to stderr, time-stamped, without the records marked
    ``stage_log_only`` (:data:`asrtrain.STAGE_LOG_ONLY`: they go to the stage's log file)."""
    handler = BarSafeHandler(sys.stderr)
    handler.addFilter(lambda record: not getattr(record, "stage_log_only", False))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s",
                                           datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
