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
    # back-pointers name slots among a state's incoming arcs: a byte each when they fit
    back = torch.empty(t_max, total, device=device,
                       dtype=torch.int8 if k_max <= 127 else torch.int32)
    # the best incoming arc of every state, in a few operations on [slots, states] tensors
    # (each torch call costs microseconds whatever its size; a search frame was ~30 of them):
    # the max over slots, then the first slot that reaches it, as the largest of ``k_max - k``
    # over the slots equal to the max (torch's max with indices over a short axis is slow):
    # ``back`` holds ``k_max - slot``. The same choice as a running max over the slots that
    # keeps the first strict maximum, one slot a vector (~5 calls a slot): 20% less time in the
    # tiny SAT chain's align stage, whose blocks' batches hold ~3k states; about even at 40k
    # frames a batch (~16k states), twice the default batch_frames.
    rank = torch.arange(k_max, 0, -1, device=device, dtype=torch.float32)[:, None]
    best, arg = torch.empty(total, device=device), torch.empty(total, device=device)
    cand = torch.empty(k_max * total, device=device)
    hit = torch.empty(k_max * total, device=device)
    views_of = -1
    for t in range(1, t_max):
        n = prefix[t]
        if n != views_of:   # the prefix shrinks only as utterances end: its tables made then
            views_of = n
            b, a, head = best[:n], arg[:n], score[:n]
            src_n = in_src[:n].T.contiguous().view(-1)       # [k_max * n], slot-major
            weight_n = in_w[:n].T.contiguous()                # [k_max, n]
            c, h = cand[:k_max * n].view(k_max, n), hit[:k_max * n].view(k_max, n)
        torch.index_select(score, 0, src_n, out=c.view(-1))
        c.add_(weight_n)
        torch.amax(c, 0, out=b)
        torch.eq(c, b, out=h)
        torch.amax(h.mul_(rank), 0, out=a)
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
            cur[:live[t]] = src_np[in_arc_np[c, k_max - back_np[t, c]]]
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
