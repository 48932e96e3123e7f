"""Batched Viterbi alignment of utterances through their training graphs, in torch.

The graphs of a batch are concatenated into one big acceptor (state ids offset per utterance) and
all utterances advance one frame per step: per arc ``score[src] + weight``, a scatter-max into the
destination states, plus the scaled acoustic log-likelihood of each state's pdf.  Back-pointers
(the slot of the winning arc among each state's incoming ones, at every frame) are kept as an
int8 ``[frames, states]`` tensor and traced back for all utterances together, in numpy.  Exact
Viterbi (no beam), like Kaldi's ``gmm-align-compiled`` with an unlimited beam.
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
    only, see :meth:`DiagGmmSet.pdf_loglikes`).  The utterances are searched longest first, so
    at every frame the states still running are a prefix of the batch's: each step works on
    that prefix only, and an ended utterance's states keep their scores untouched."""
    if not graphs:
        return []
    by_len = sorted(range(len(graphs)), key=lambda i: -int(acoustics_of[i].shape[0]))
    found = _viterbi_longest_first([graphs[i] for i in by_len],
                                   [acoustics_of[i] for i in by_len], acoustic_scale,
                                   torch.device(device))
    out: list[Alignment | None] = [None] * len(graphs)
    for k, i in enumerate(by_len):
        out[i] = found[k]
    return out


def _viterbi_longest_first(graphs: list[HmmGraph], acoustics_of: list[torch.Tensor],
                           acoustic_scale: float, device: torch.device) -> list[Alignment]:
    """:func:`viterbi_states` of utterances in order of decreasing length."""
    # One function on purpose (over 80 lines): the batched tensors built at the top are used by
    # the forward pass and the backtrace below; split, they would travel as a dozen arguments.
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
    # scaled acoustic score of every state at every frame of its utterance (the frames past
    # an utterance's end are never read: the search runs on the running prefix only, the
    # backtrace within each utterance's length; left unset, their pages are never touched)
    acoustics = torch.empty(t_max, total, device=device)
    for i, ll in enumerate(acoustics_of):
        torch.mul(ll.to(device).float(), acoustic_scale,
                  out=acoustics[:lengths[i], offsets[i]:offsets[i + 1]])
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

    # the states of the utterances still running at frame t: a prefix, as lengths decrease
    running = np.searchsorted(-np.asarray(lengths), -np.arange(t_max), side="left")
    prefix = offsets[running].tolist()
    score = torch.cat([start + acoustics[0], torch.tensor([neg_inf], device=device)])
    # back-pointers are slots among a state's incoming arcs: a byte each when they fit
    back = torch.empty(t_max, total, device=device,
                       dtype=torch.int8 if k_max <= 127 else torch.int32)
    # the max over a state's incoming arcs as a running max over arc slots, each slot a vector
    # over all states (a max over a short inner axis, and bool masks, are slow in torch); the
    # slot of the first strict maximum is kept, as torch.max(dim) returns it
    srcs = [in_src[:, k].contiguous() for k in range(k_max)]
    weights = [in_w[:, k].contiguous() for k in range(k_max)]
    best, cand, arg, up = (torch.empty(total, device=device) for _ in range(4))
    views_of = -1
    for t in range(1, t_max):
        n = prefix[t]
        if n != views_of:   # the prefix shrinks only as utterances end: its views made then
            views_of = n
            b, c, a, u, head = best[:n], cand[:n], arg[:n], up[:n], score[:n]
            src_n, weight_n = [s[:n] for s in srcs], [w[:n] for w in weights]
        torch.index_select(score, 0, src_n[0], out=b).add_(weight_n[0])
        a.zero_()
        for k in range(1, k_max):
            torch.index_select(score, 0, src_n[k], out=c).add_(weight_n[k])
            torch.lt(b, c, out=u)                        # 1.0 where slot k is strictly better
            torch.maximum(a, u.mul_(k), out=a)           # k exceeds every earlier slot
            torch.maximum(b, c, out=b)
        back[t, :n] = a
        torch.add(b, acoustics[t, :n], out=head)
    score = score[:total]
    end = score + final
    best_end = torch.full((len(graphs),), neg_inf, device=device).scatter_reduce(
        0, utt_of_state, end, reduce="amax", include_self=True)
    state_ids = torch.arange(total, device=device)
    is_best = (end == best_end[utt_of_state]) & torch.isfinite(end)
    last = torch.full((len(graphs),), -1, dtype=torch.long, device=device).scatter_reduce(
        0, utt_of_state[is_best], state_ids[is_best], reduce="amax", include_self=True)
    # the backtrace in numpy, on the host: a few small index operations a frame, each a
    # microsecond there (the torch ones were ten times that; on a GPU, a launch each)
    back_np, in_arc_np, src_np = back.cpu().numpy(), in_arc.cpu().numpy(), src.cpu().numpy()
    last_np, best_np = last.cpu().numpy(), best_end.cpu().numpy()
    ok = np.flatnonzero(last_np >= 0)      # in decreasing length, as the batch is
    path = np.empty((len(graphs), t_max), dtype=np.int64)
    cur = last_np[ok]
    live = np.searchsorted(-np.asarray(lengths)[ok], -np.arange(t_max), side="left")
    for t in range(t_max - 1, -1, -1):
        c = cur[:live[t]]
        path[ok[:live[t]], t] = c
        if t > 0:
            cur[:live[t]] = src_np[in_arc_np[c, back_np[t, c]]]
    out = []
    for i in range(len(graphs)):
        if last_np[i] < 0:
            out.append(Alignment(None, neg_inf, neg_inf))
            continue
        states = path[i, :lengths[i]] - offsets[i]
        ll = acoustics_of[i].float()
        ac = float(ll[torch.arange(lengths[i], device=ll.device),
                      torch.from_numpy(states).to(ll.device)].sum())
        out.append(Alignment(states, float(best_np[i]), ac))
    return out
