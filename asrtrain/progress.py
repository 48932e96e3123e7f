"""Progress a person sees: a bar on a terminal, and a line on the console at least every
``every_s()`` seconds while a long step runs, with an ETA, on a terminal or in a CI log.

Every long loop counts its work with :class:`Bar` (a ``tqdm``); nothing else is needed:

    for utt in Bar(utts, desc=f"align {name}", unit="utt"):
        ...

- On a terminal (stderr a tty) the bar is drawn; where the terminal reports no size (a pty
  that nobody sized, as script runners and some IDEs make) it is drawn 80 columns wide, where a
  plain ``tqdm`` draws nothing.  Elsewhere (a pipe, a file, CI) nothing is drawn.
- In either case, when the console has shown no log line for ``every_s()`` seconds while bars
  are open, one heartbeat line is logged that names the open bars, outermost first, with their
  counts, time so far and time left, e.g. ``still working: tri1 3/11 iter, 2:10 so far, ETA
  4:20 › align jobs 1/2 job, 0:40 so far, ETA 0:40``.  ``ASRTRAIN_PROGRESS_EVERY_S`` sets the
  interval (default 30 s, so a 60 s silence is never reached).

The heartbeat runs in the process that logs to the console (``asrtrain``'s own process): the bars
of job processes are drawn by them, the waiting loop of their pool (:func:`asrtrain.jobs.run_jobs`)
is a :class:`Bar` in the main process and carries the heartbeat.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time
import weakref
from typing import Any

from tqdm import tqdm

from asrtrain import AsrtrainError

# tqdm's default lock is a multiprocessing lock too: a semaphore that a learner ending with
# os._exit never releases, so its resource tracker printed "leaked semaphore objects" on the
# console for every learner. A bar is drawn by its own process: a thread lock is enough.
tqdm.set_lock(threading.RLock())

log = logging.getLogger("asrtrain.progress")

ENV_EVERY_S = "ASRTRAIN_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 30.0


def every_s() -> float:
    """Seconds of console silence after which a heartbeat line is logged while bars are open."""
    raw = os.environ.get(ENV_EVERY_S, "")
    if not raw:
        return DEFAULT_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        raise AsrtrainError(f"{ENV_EVERY_S}={raw!r}: expected a number of seconds") from None
    if not value > 0:
        raise AsrtrainError(f"{ENV_EVERY_S}={raw!r}: expected a number of seconds > 0")
    return value


class _NullStream:
    """Where a bar writes when stderr is not a terminal: its counts still advance (the heartbeat
    reads them), nothing is shown."""

    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


_NULL = _NullStream()


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _terminal_size(stream: Any) -> tuple[int, int] | None:
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return None
    return size.columns, size.lines


class Bar(tqdm):
    """A ``tqdm`` that shows on a terminal only (``disable=True`` still turns it off, ``None``
    and ``False`` mean "on a terminal") and that the heartbeat reports while it is open.
    ``hidden=True``: never drawn, still reported (a step of one job, whose own bar is drawn)."""

    def __init__(self, iterable: Any = None, *args: Any, file: Any = None,
                 disable: bool | None = None, ncols: int | None = None,
                 nrows: int | None = None, hidden: bool = False, **kwargs: Any) -> None:
        stream = sys.stderr if file is None else file
        shown = disable is not True and not hidden and _is_tty(stream)
        if shown and ncols is None:
            cols, rows = _terminal_size(stream) or (0, 0)
            if cols <= 0:   # an unsized pty: tqdm would compute a width of -1 and draw nothing
                ncols = int(os.environ.get("COLUMNS") or 80)
                nrows = nrows or int(os.environ.get("LINES") or 24)
        self._heartbeat = disable is not True
        super().__init__(iterable, *args, file=stream if shown else _NULL,
                         disable=disable is True, ncols=ncols, nrows=nrows, **kwargs)
        if self._heartbeat:
            _Heartbeat.open(self)

    def close(self) -> None:
        if getattr(self, "_heartbeat", False):
            _Heartbeat.close(self)
        super().close()

    def status(self) -> str:
        """``desc n/total unit, elapsed so far, ETA left`` (``ETA unknown`` before the first
        unit is done or without a total)."""
        d = self.format_dict
        n, total, elapsed = d["n"], d["total"], d["elapsed"]
        unit = d.get("unit") or "it"
        count = f"{n:g}/{total:g}" if total else f"{n:g}"
        eta = "unknown"
        if total and n > 0 and elapsed > 0:
            eta = tqdm.format_interval(max(0.0, (total - n) * elapsed / n))
        elif total and n >= total:
            eta = "0:00"
        desc = d.get("prefix") or "working"
        return f"{desc} {count} {unit}, {tqdm.format_interval(elapsed)} so far, ETA {eta}"


class _ConsoleClock(logging.Handler):
    """Notes when the console last showed a log line (records marked ``stage_log_only`` go to
    a stage's log file only)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.last = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "stage_log_only", False):
            self.last = time.monotonic()


class _Heartbeat:
    """One daemon thread per process: logs the open bars when the console has been silent.

    Its locks are re-entrant: a bar that the garbage collector finalizes (``tqdm.__del__``
    closes it) may do so in a thread that holds the lock already.  A fork (a job pool's
    worker) waits for a heartbeat line being written, and the child starts with fresh locks and
    no thread, so no child inherits a lock held by a thread it does not have."""

    _lock = threading.RLock()
    _emit_lock = threading.Lock()
    _bars: list[weakref.ref[Bar]] = []   # open bars, outermost first; closed ones pruned
    _clock: _ConsoleClock | None = None
    _thread: threading.Thread | None = None

    @classmethod
    def open(cls, bar: Bar) -> None:
        every_s()   # a bad setting is said here, in the step, not lost in the thread
        with cls._lock:
            cls._bars.append(weakref.ref(bar))
            if cls._thread is None and cls._console_process():
                cls._clock = _ConsoleClock()
                logging.getLogger().addHandler(cls._clock)
                cls._thread = threading.Thread(target=cls._run, name="asrtrain-progress",
                                               daemon=True)
                cls._thread.start()

    @classmethod
    def close(cls, bar: Bar) -> None:
        with cls._lock:
            cls._bars = [r for r in cls._bars if r() is not None and r() is not bar]

    @staticmethod
    def _console_process() -> bool:
        """The process whose log lines reach the console: not a job process of a pool, not a
        learner other than rank 0, and one with somewhere to log to."""
        if multiprocessing.parent_process() is not None:
            return False
        if os.environ.get("RANK", "0") != "0":
            return False
        return bool(logging.getLogger().handlers)

    @classmethod
    def _run(cls) -> None:
        while True:
            every = every_s()
            time.sleep(min(1.0, every / 4))
            with cls._lock:
                bars = [b for b in (r() for r in cls._bars) if b is not None and not b.disable]
            clock = cls._clock
            if not bars or clock is None:
                continue
            if time.monotonic() - clock.last < every:
                continue
            try:
                line = " › ".join(b.status() for b in bars)
            except Exception:  # noqa: BLE001 - a bar closed under us: next tick
                continue
            with cls._emit_lock:
                log.info("still working: %s", line)
            clock.last = time.monotonic()   # the line itself resets the clock, logged or not

    @classmethod
    def _after_fork_in_child(cls) -> None:
        cls._lock = threading.RLock()
        cls._emit_lock = threading.Lock()
        cls._bars = []
        cls._thread = None
        if cls._clock is not None:
            logging.getLogger().removeHandler(cls._clock)
            cls._clock = None


os.register_at_fork(before=lambda: _Heartbeat._emit_lock.acquire(),
                    after_in_parent=lambda: _Heartbeat._emit_lock.release(),
                    after_in_child=_Heartbeat._after_fork_in_child)
