"""Reading a CTC head's outputs: the best unit per frame, repeats merged, blanks removed.

Shared by training (dev-set unit error rate) and greedy decoding (``decode/ctc.py``).
"""

from __future__ import annotations

import torch


def greedy_units(logits: torch.Tensor, lengths: torch.Tensor,
                 blank: int = 0) -> list[list[tuple[int, int]]]:
    """(unit id, output frame) of every emitted unit, per utterance of the batch."""
    best = logits.argmax(-1).cpu()
    out = []
    for b in range(best.shape[0]):
        seq, prev = [], blank
        for t, u in enumerate(best[b, : int(lengths[b])].tolist()):
            if u != blank and u != prev:
                seq.append((u, t))
            prev = u
        out.append(seq)
    return out
