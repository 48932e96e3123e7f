"""Where a gossip thread copies parameters out and changes back in, ordered against training.

A GPU learner's model is read and written by two threads: the main thread's optimizer steps (on
the main CUDA stream) and the gossip thread's snapshots and updates. Done on the main stream
from the gossip thread, a snapshot's device-to-host copy waits for every kernel queued before it
and holds the model lock meanwhile, so the next step waits for the copy: gossip on the critical
path. :class:`SideStream` gives the gossip thread a CUDA stream of its own, and events that order
exactly what must be ordered, with no host waiting on the main thread:

- a snapshot copy starts after the last model update queued on the main stream (``updated``),
  so it sees a whole step, never half of one;
- the next model update on the main stream starts after the gossip thread's last copy or update
  (``side_done``), so a step never overwrites parameters being copied or changed;
- the gossip thread waits for its own copies (``synchronize``) before it sends what it copied,
  outside the model lock.

Forward and backward passes are not ordered against gossip updates, as on the CPU: AD-PSGD's
gradients may be computed on a model a gossip update is changing. Both threads queue their work
under the model lock, so the event each one waits for is the other's latest.

:class:`NullStream` is the same interface on the CPU, where every copy is done when it returns:
the code path of the gossip thread is the same on both devices.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class NullStream:
    """CPU parameters: nothing is queued, so nothing needs ordering."""

    device = torch.device("cpu")
    pin_memory = False

    def before_update(self) -> None:
        """Main thread, under the model lock, before it changes the parameters."""

    def after_update(self) -> None:
        """Main thread, under the model lock, after it queued a change of the parameters."""

    @contextlib.contextmanager
    def thread(self) -> Iterator[None]:
        """The gossip thread's whole life runs inside this (its device and stream)."""
        yield

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        """Gossip thread, under the model lock: work that reads or writes the parameters."""
        yield

    def synchronize(self) -> None:
        """Gossip thread: wait until its queued copies are done (host buffers readable)."""


class SideStream(NullStream):
    """CUDA parameters: the gossip thread's own stream, ordered by events (module docstring)."""

    pin_memory = True  # host buffers of async copies must be page-locked

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.updated = torch.cuda.Event()    # recorded on the main stream after each update
        self.side_done = torch.cuda.Event()  # recorded on the side stream after gossip's work

    def before_update(self) -> None:
        # An event never recorded is complete: the first step waits for nothing.
        torch.cuda.current_stream(self.device).wait_event(self.side_done)

    def after_update(self) -> None:
        self.updated.record(torch.cuda.current_stream(self.device))

    @contextlib.contextmanager
    def thread(self) -> Iterator[None]:
        # The current device and stream are per thread: set once for the gossip thread.
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        self.stream.wait_event(self.updated)
        yield
        self.side_done.record(self.stream)

    def synchronize(self) -> None:
        self.side_done.synchronize()


def streams_for(params: list[torch.Tensor]) -> NullStream:
    """The stream object for parameters on one device: a side stream for CUDA, else the null one.

    Decided by where the parameters are, not by CUDA's availability, so a CPU model never
    touches CUDA.
    """
    device = params[0].device if params else torch.device("cpu")
    return SideStream(device) if device.type == "cuda" else NullStream()
