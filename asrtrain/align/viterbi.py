"""Batched Viterbi alignment of utterances through their training graphs, in torch.

The graphs of a batch are concatenated into one big acceptor (state ids offset per utterance) and
all utterances advance one frame per step: per arc ``score[src] + weight``, a scatter-max into the
destination states, plus the scaled acoustic log-likelihood of each state's pdf.  Back-pointers
(the winning arc of every state at every frame) are kept as an int32 ``[frames, states]`` tensor
and traced back for all utterances together.  Exact Viterbi (no beam), like Kaldi's
``gmm-align-compiled`` with an unlimited beam.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from asrtrain.align.graph import HmmGraph


@dataclass
class Alignment:
    states: np.ndarray | None   # [T] graph state per frame, None when no path exists
    score: float                # best path score (scaled acoustics + graph weights)
    acoustic: float             # unscaled acoustic log-likelihood along the path


def viterbi_batch(graphs: list[HmmGraph], loglikes: list[torch.Tensor],
                  acoustic_scale: float = 0.1,
                  device: torch.device | str = "cpu") -> list[Alignment]:
    """Align each utterance (``loglikes[u]``: ``[T_u, num_pdfs]``) through ``graphs[u]``."""
    states = [ll[:, torch.from_numpy(g.pdf).to(ll.device)]
              for g, ll in zip(graphs, loglikes, strict=True)]
    return viterbi_states(graphs, states, acoustic_scale, device)


def viterbi_states(graphs: list[HmmGraph], acoustics_of: list[torch.Tensor],
                   acoustic_scale: float = 0.1,
                   device: torch.device | str = "cpu") -> list[Alignment]:
    """Align each utterance through ``graphs[u]`` given ``acoustics_of[u]``, ``[T_u, S_u]``: the
    log-likelihood of each graph state's pdf at each frame (made from the pdfs the graph uses
    only, see :meth:`DiagGmmSet.pdf_loglikes`)."""
    # One function on purpose (over 80 lines): the batched tensors built at the top are used by
    # the forward pass and the backtrace below; split, they would travel as a dozen arguments.
    device = torch.device(device)
    lengths = [int(ll.shape[0]) for ll in acoustics_of]
    offsets = np.cumsum([0] + [g.num_states for g in graphs])
    total = int(offsets[-1])
    t_max = max(lengths)
    neg_inf = -float("inf")

    def cat(name: str, add_offset: bool = False) -> torch.Tensor:
        parts = [getattr(g, name) + (offsets[i] if add_offset else 0)
                 for i, g in enumerate(graphs)]
        return torch.from_numpy(np.concatenate(parts)).to(device)

    src, dst = cat("src", True), cat("dst", True)
    weight = cat("weight").float()
    start, final = cat("start").float(), cat("final").float()
    utt_of_state = torch.from_numpy(np.repeat(np.arange(len(graphs)),
                                              np.diff(offsets))).to(device)
    len_of_state = torch.tensor(lengths, device=device)[utt_of_state]
    # acoustic score of every state at every frame (frames past an utterance's end stay 0)
    acoustics = torch.zeros(t_max, total, device=device)
    for i, ll in enumerate(acoustics_of):
        acoustics[:lengths[i], offsets[i]:offsets[i + 1]] = ll.to(device).float()
    # incoming arcs of every state padded to the largest in-degree: one gather, one max per frame
    # (the max returns the back-pointer too); padding arcs come from a dummy -inf state
    order = torch.argsort(dst, stable=True)
    indeg = torch.bincount(dst, minlength=total)
    k_max = int(indeg.max()) if len(dst) else 1
    slot = torch.arange(len(dst), device=device) - (torch.cumsum(indeg, 0) - indeg)[dst[order]]
    in_src = torch.full((total, k_max), total, dtype=torch.long, device=device)
    in_w = torch.full((total, k_max), neg_inf, device=device)
    in_arc = torch.full((total, k_max), -1, dtype=torch.long, device=device)
    in_src[dst[order], slot] = src[order]
    in_w[dst[order], slot] = weight[order]
    in_arc[dst[order], slot] = order

    # scaled row by row in the loop (the same products): a scaled copy of the whole
    # [frames, states] matrix was a third of a batch's memory
    score = torch.cat([start + acoustic_scale * acoustics[0],
                       torch.tensor([neg_inf], device=device)])
    back = torch.full((t_max, total), -1, dtype=torch.int32, device=device)
    active_mask = torch.zeros(total + 1, dtype=torch.bool, device=device)
    for t in range(1, t_max):
        best, arg = (score[in_src] + in_w).max(dim=1)
        back[t] = arg.int()
        # states of utterances that have ended keep their final scores
        active_mask[:total] = len_of_state > t
        step = torch.cat([best + acoustic_scale * acoustics[t], score[-1:]])
        score = torch.where(active_mask, step, score)
    score = score[:total]
    end = score + final
    best_end = torch.full((len(graphs),), neg_inf, device=device).scatter_reduce(
        0, utt_of_state, end, reduce="amax", include_self=True)
    state_ids = torch.arange(total, device=device)
    is_best = (end == best_end[utt_of_state]) & torch.isfinite(end)
    cur = torch.full((len(graphs),), -1, dtype=torch.long, device=device).scatter_reduce(
        0, utt_of_state[is_best], state_ids[is_best], reduce="amax", include_self=True)
    ok = cur >= 0
    lens = torch.tensor(lengths, device=device)
    path = torch.full((len(graphs), t_max), -1, dtype=torch.long, device=device)
    cur = cur.clamp(min=0)
    for t in range(t_max - 1, -1, -1):
        live = (lens > t) & ok
        path[:, t] = torch.where(live, cur, path[:, t])
        if t > 0:
            arc = in_arc[cur, back[t][cur].long()]     # back-pointer slot -> arc
            prev = src[arc.clamp(min=0)]
            cur = torch.where(live, prev, cur)

    out = []
    path_np = path.cpu().numpy()
    for i in range(len(graphs)):
        if not bool(ok[i]):
            out.append(Alignment(None, neg_inf, neg_inf))
            continue
        states = path_np[i, :lengths[i]] - offsets[i]
        ac = float(acoustics[torch.arange(lengths[i], device=device),
                             torch.from_numpy(states + offsets[i]).to(device)].sum())
        out.append(Alignment(states.astype(np.int64), float(best_end[i]), ac))
    return out
