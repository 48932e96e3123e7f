"""Phonetic decision trees (Kaldi's ``acc-tree-stats``, ``cluster-phones``, ``build-tree``).

A context is ``(left, phone, right, pdf_class)`` with phone ids (0 = utterance boundary).  Every
base phone is one root ("shared split" in Kaldi's roots.txt: its word-position variants and all its
HMM states start on one tree); a question asks whether the left phone (key 0), the central phone
(key 1), the right phone (key 2) is in a phone set, or whether the pdf-class (key -1) is in a set of
HMM states.  Phone sets come from clustering the phones bottom-up by the likelihood loss of merging
their single-Gaussian statistics (each cluster formed becomes a question, as cluster-phones gives
a hierarchy of sets), plus the dict's extra questions and the word-position questions.  The tree is
grown greedily: the split with the largest likelihood gain anywhere is made next, until
``num_leaves`` leaves or no split gains more than ``thresh`` with at least ``min_count`` frames on
each side.  Leaves are numbered as pdf ids.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from asrtrain.progress import Bar

KEY_PDF_CLASS = -1
LOG_2PI = math.log(2 * math.pi)


@dataclass
class TreeStats:
    """Single-Gaussian statistics per context: ``keys`` [K, 4] (left, phone, right, pdf_class),
    ``stats`` [K, 1 + 2D] (count, sum x, sum x^2)."""

    keys: np.ndarray
    stats: np.ndarray

    @classmethod
    def accumulate(cls, items: Iterable[tuple[np.ndarray, np.ndarray]]) -> TreeStats:
        """From per-utterance ``(contexts [T, 4], feats [T, D])``; ``items`` is iterated twice
        (contexts first, then statistics) and may make each pair on the fly, so memory holds one
        utterance's float64 copy, not the corpus's (Kaldi's acc-tree-stats streams too).  The
        sums are added frame by frame in corpus order, as one ``np.add.at`` over all frames."""
        codes = [np.unique(_context_codes(k)) for k, _ in items]
        uniq = np.unique(np.concatenate(codes)) if codes else np.zeros(0, dtype=np.int64)
        stats = None
        for k, f in items:
            x = f.astype(np.float64)
            if stats is None:
                stats = np.zeros((len(uniq), 1 + 2 * x.shape[1]))
            np.add.at(stats, np.searchsorted(uniq, _context_codes(k)),
                      np.concatenate([np.ones((len(x), 1)), x, x * x], 1))
        keys = np.stack([(uniq >> sh) & mask for sh, mask in _CODE_FIELDS], axis=1)
        return cls(keys, stats if stats is not None else np.zeros((0, 1)))

    def add(self, other: TreeStats) -> None:
        """Sum another job's statistics into these (Kaldi ``sum-tree-stats``): the union of
        the contexts, in sorted order, each one's rows added."""
        if not len(other.keys):
            return
        if not len(self.keys):
            self.keys, self.stats = other.keys.copy(), other.stats.copy()
            return
        mine, theirs = _context_codes(self.keys), _context_codes(other.keys)
        uniq = np.union1d(mine, theirs)
        stats = np.zeros((len(uniq), self.stats.shape[1]))
        stats[np.searchsorted(uniq, mine)] += self.stats
        stats[np.searchsorted(uniq, theirs)] += other.stats
        self.keys = np.stack([(uniq >> sh) & mask for sh, mask in _CODE_FIELDS], axis=1)
        self.stats = stats


# (shift, mask) of left, phone, right, pdf_class in a context's int64 code: codes sort as the
# contexts do (lexicographically), so np.unique over codes gives np.unique(axis=0)'s order
_CODE_FIELDS = ((40, 0xFFFF), (24, 0xFFFF), (8, 0xFFFF), (0, 0xFF))


def _context_codes(ctx: np.ndarray) -> np.ndarray:
    """One int64 per ``(left, phone, right, pdf_class)`` row (8 bytes a frame, not 32)."""
    ctx = np.asarray(ctx, dtype=np.int64).reshape(-1, 4)
    if len(ctx) and (ctx.min() < 0 or ctx[:, :3].max() > 0xFFFF or ctx[:, 3].max() > 0xFF):
        raise ValueError(f"context out of range for tree statistics: {ctx.min()}..{ctx.max()}")
    return (ctx[:, 0] << 40) | (ctx[:, 1] << 24) | (ctx[:, 2] << 8) | ctx[:, 3]


def gaussian_loglike(stats: np.ndarray, var_floor: np.ndarray) -> np.ndarray:
    """Log-likelihood of the data under its own ML diagonal Gaussian, for rows of stats."""
    stats = np.atleast_2d(stats)
    n = stats[:, 0]
    d = (stats.shape[1] - 1) // 2
    safe = np.maximum(n, 1e-10)[:, None]
    mean = stats[:, 1:1 + d] / safe
    var = np.maximum(stats[:, 1 + d:] / safe - mean * mean, var_floor)
    return np.where(n > 0, -0.5 * n * (d * (1 + LOG_2PI) + np.log(var).sum(1)), 0.0)


def cluster_phones(stats: TreeStats, sets: list[list[int]], var_floor: np.ndarray,
                   pdf_class: int = 1) -> list[set[int]]:
    """Question sets from bottom-up clustering of the phone sets (each a base phone's variants),
    on the statistics of HMM state ``pdf_class`` (Kaldi's cluster-phones --pdf-class-list=1)."""
    where = {p: i for i, s in enumerate(sets) for p in s}
    pooled = np.zeros((len(sets), stats.stats.shape[1]))
    for (_, p, _, c), row in zip(stats.keys, stats.stats, strict=True):
        if c == pdf_class and p in where:
            pooled[where[p]] += row
    clusters = [(set(s), pooled[i]) for i, s in enumerate(sets) if pooled[i, 0] > 0]
    questions = [set(c) for c, _ in clusters]
    while len(clusters) > 2:
        like = gaussian_loglike(np.stack([s for _, s in clusters]), var_floor)
        best, pair = math.inf, (0, 1)
        for i in range(len(clusters)):
            merged = clusters[i][1][None, :] + np.stack([s for _, s in clusters[i + 1:]]) \
                if i + 1 < len(clusters) else None
            if merged is None:
                continue
            loss = like[i] + like[i + 1:] - gaussian_loglike(merged, var_floor)
            j = int(np.argmin(loss))
            if loss[j] < best:
                best, pair = float(loss[j]), (i, i + 1 + j)
        i, j = pair
        new = (clusters[i][0] | clusters[j][0], clusters[i][1] + clusters[j][1])
        clusters = [c for k, c in enumerate(clusters) if k not in pair] + [new]
        questions.append(set(new[0]))
    return questions


@dataclass
class Tree:
    """``nodes[i]`` is ``("leaf", pdf)`` or ``("split", key, values, yes, no)``;
    ``roots[root_index]`` the node of each base phone; ``root_of[phone]`` its root index."""

    nodes: list[tuple]
    roots: dict[int, int]
    root_of: dict[int, int]
    num_pdfs: int
    _cache: dict = field(default_factory=dict, repr=False)
    # context codes (sorted) and their pdfs, for :meth:`pdfs`; grows as contexts are seen
    _codes: tuple[np.ndarray, np.ndarray] = field(
        default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0, np.int64)),
        repr=False, compare=False)
    _walk_tables: tuple = field(default=(), repr=False, compare=False)   # see :meth:`_walk`

    def pdf(self, left: int, phone: int, right: int, pdf_class: int) -> int:
        key = (left, phone, right, pdf_class)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        ctx = {0: left, 1: phone, 2: right, KEY_PDF_CLASS: pdf_class}
        node = self.nodes[self.roots[self.root_of[phone]]]
        while node[0] == "split":
            node = self.nodes[node[3] if ctx[node[1]] in node[2] else node[4]]
        self._cache[key] = node[1]
        return node[1]

    def pdfs(self, ctx: np.ndarray) -> np.ndarray:
        """The pdf of every ``(left, phone, right, pdf_class)`` row of ``ctx`` ``[N, 4]``, as
        :meth:`pdf` gives it: the rows' int64 codes are looked up in a sorted table of the codes
        seen so far (a binary search for all rows at once); only codes new to the table walk
        the tree, once each.  A training pass meets the same few ten thousand contexts every
        iteration, so after the first batch the walk is rare."""
        codes = _context_codes(ctx)
        uniq, inv = np.unique(codes, return_inverse=True)
        known, known_pdf = self._codes
        pos = np.minimum(np.searchsorted(known, uniq), max(len(known) - 1, 0))
        hit = (known[pos] == uniq) if len(known) else np.zeros(len(uniq), dtype=bool)
        if not hit.all():
            new = uniq[~hit]
            new_pdf = self._walk(np.stack([(new >> sh) & mask for sh, mask in _CODE_FIELDS],
                                          axis=1))
            merged = np.concatenate([known, new])
            by = np.argsort(merged, kind="stable")
            self._codes = (merged[by], np.concatenate([known_pdf, new_pdf])[by])
            known, known_pdf = self._codes
            pos = np.searchsorted(known, uniq)
        return known_pdf[pos][inv.reshape(-1)]

    def _walk(self, ctx: np.ndarray) -> np.ndarray:
        """:meth:`pdf` of every row of ``ctx`` ``[N, 4]``, all rows down the tree together: one
        step per level, each split's question a row of a ``[splits, values]`` membership
        table."""
        if not self._walk_tables:
            splits = [i for i, n in enumerate(self.nodes) if n[0] == "split"]
            values = 1 + max([0, *self.root_of, *(v for i in splits for v in self.nodes[i][2])])
            row = np.full(len(self.nodes), -1, dtype=np.int64)
            row[splits] = np.arange(len(splits))
            member = np.zeros((len(splits), values), dtype=bool)
            column = np.zeros(len(self.nodes), dtype=np.int64)  # 0, 1, 2: phones; 3: pdf class
            yes, no = np.zeros_like(column), np.zeros_like(column)
            pdf = np.full(len(self.nodes), -1, dtype=np.int64)
            for i, n in enumerate(self.nodes):
                if n[0] == "leaf":
                    pdf[i] = n[1]
                    continue
                member[row[i], sorted(n[2])] = True
                column[i] = 3 if n[1] == KEY_PDF_CLASS else n[1]
                yes[i], no[i] = n[3], n[4]
            root = np.full(values, -1, dtype=np.int64)
            for phone, r in self.root_of.items():
                root[phone] = self.roots[r]
            self._walk_tables = (row, member, column, yes, no, pdf, root)
        row, member, column, yes, no, pdf, root = self._walk_tables
        phone = ctx[:, 1]
        bad = (phone >= len(root)) | (root[np.minimum(phone, len(root) - 1)] < 0)
        if bad.any():
            raise KeyError(int(phone[bad][0]))      # as pdf() does for a phone of no root
        node = root[phone]
        todo = np.flatnonzero(row[node] >= 0)
        while len(todo):
            at = node[todo]
            value = ctx[todo, column[at]]
            ok = value < member.shape[1]
            inside = ok & member[row[at], np.where(ok, value, 0)]
            node[todo] = np.where(inside, yes[at], no[at])
            todo = todo[row[node[todo]] >= 0]
        return pdf[node]

    def asks_context(self) -> bool:
        return any(n[0] == "split" and n[1] in (0, 2) for n in self.nodes)

    def state_dict(self) -> dict:
        nodes = [list(n) if n[0] == "leaf" else [n[0], n[1], sorted(n[2]), n[3], n[4]]
                 for n in self.nodes]
        return {"nodes": nodes, "roots": self.roots, "root_of": self.root_of,
                "num_pdfs": self.num_pdfs}

    @classmethod
    def from_state_dict(cls, d: dict) -> Tree:
        nodes = [tuple(n) if n[0] == "leaf" else (n[0], n[1], frozenset(n[2]), n[3], n[4])
                 for n in d["nodes"]]
        return cls(nodes, dict(d["roots"]), dict(d["root_of"]), d["num_pdfs"])

    def write_text(self, phone_names: list[str]) -> str:
        """A readable dump (one line per node), written next to the model as ``tree.txt``."""
        names = {0: "left", 1: "phone", 2: "right", KEY_PDF_CLASS: "pdf-class"}
        lines = []
        for i, n in enumerate(self.nodes):
            if n[0] == "leaf":
                lines.append(f"{i} leaf pdf={n[1]}")
            else:
                vals = sorted(n[2])
                shown = vals if n[1] == KEY_PDF_CLASS else [phone_names[v] for v in vals]
                lines.append(f"{i} {names[n[1]]} in {{{' '.join(map(str, shown))}}} "
                             f"yes={n[3]} no={n[4]}")
        return "\n".join(lines) + "\n"


def mono_tree(root_of: dict[int, int], num_states: dict[int, int]) -> Tree:
    """The monophone "tree": one pdf per (base phone, HMM state), no context."""
    nodes: list[tuple] = []
    roots: dict[int, int] = {}
    pdf = 0
    for root in sorted(set(root_of.values())):
        n = max(num_states[p] for p, r in root_of.items() if r == root)
        leaves = []
        for _ in range(n):
            nodes.append(("leaf", pdf))
            leaves.append(len(nodes) - 1)
            pdf += 1
        # a chain "pdf-class == k ?" ending in the last state's leaf
        nxt = leaves[-1]
        for k in range(n - 2, -1, -1):
            nodes.append(("split", KEY_PDF_CLASS, frozenset({k}), leaves[k], nxt))
            nxt = len(nodes) - 1
        roots[root] = nxt
    return Tree(nodes, roots, dict(root_of), pdf)


def build_tree(stats: TreeStats, root_of: dict[int, int], phone_questions: list[set[int]],
               num_states: dict[int, int], num_leaves: int, var_floor: np.ndarray,
               thresh: float = 0.0, min_count: float = 10.0) -> tuple[Tree, dict]:
    """Grow the tree greedily by likelihood gain (see the module docstring).  Returns the tree and
    a summary (leaves, gain, objective before and after)."""
    # One function on purpose (over 80 lines): the question sets, the per-leaf statistics and
    # the priority queue of candidate splits are shared state of a single greedy loop.
    questions: dict[int, list[frozenset[int]]] = {}
    uniq_q = sorted({frozenset(q) for q in phone_questions if q}, key=sorted)
    for key in (0, 1, 2):
        questions[key] = uniq_q
    max_states = max(num_states.values())
    questions[KEY_PDF_CLASS] = sorted(
        {frozenset(range(k + 1)) for k in range(max_states - 1)}
        | {frozenset({k}) for k in range(max_states)}, key=sorted)

    keys, data = stats.keys, stats.stats
    col = {0: keys[:, 0], 1: keys[:, 1], 2: keys[:, 2], KEY_PDF_CLASS: keys[:, 3]}
    masks = {k: np.stack([np.isin(col[k], list(q)) for q in qs]) for k, qs in questions.items()}

    def best_split(idx: np.ndarray) -> tuple[float, int, int] | None:
        total = data[idx].sum(0)
        base = float(gaussian_loglike(total, var_floor)[0])
        best = None
        for key, m in masks.items():
            sub = m[:, idx].astype(np.float64)          # [Q, K]
            yes = sub @ data[idx]
            no = (1.0 - sub) @ data[idx]   # summed as yes is: complementary questions tie exactly
            okq = (yes[:, 0] >= min_count) & (no[:, 0] >= min_count)
            if not okq.any():
                continue
            gain = gaussian_loglike(yes, var_floor) + gaussian_loglike(no, var_floor) - base
            gain = np.where(okq, gain, -np.inf)
            q = int(np.argmax(gain))
            if best is None or gain[q] > best[0]:
                best = (float(gain[q]), key, q)
        return best

    nodes: list[tuple] = []
    members: dict[int, np.ndarray] = {}
    roots: dict[int, int] = {}
    heap: list[tuple[float, int, int, int]] = []
    root_arr = np.array([root_of.get(int(p), -1) for p in keys[:, 1]])
    objective = 0.0
    for root in sorted(set(root_of.values())):
        idx = np.nonzero(root_arr == root)[0]
        nodes.append(("leaf", -1))
        roots[root] = len(nodes) - 1
        members[len(nodes) - 1] = idx
        if len(idx):
            objective += float(gaussian_loglike(data[idx].sum(0), var_floor)[0])
            b = best_split(idx)
            if b is not None:
                heapq.heappush(heap, (-b[0], len(nodes) - 1, b[1], b[2]))
    start_objective = objective
    leaves = len(roots)
    bar = Bar(total=num_leaves, initial=leaves, desc="tree", unit="leaf", file=sys.stderr,
               disable=None, leave=False)
    while heap and leaves < num_leaves:
        neg_gain, node, key, q = heapq.heappop(heap)
        if -neg_gain <= thresh:
            break
        idx = members.pop(node)
        in_q = masks[key][q, idx]
        children = []
        for part in (idx[in_q], idx[~in_q]):
            nodes.append(("leaf", -1))
            members[len(nodes) - 1] = part
            children.append(len(nodes) - 1)
            b = best_split(part)
            if b is not None:
                heapq.heappush(heap, (-b[0], len(nodes) - 1, b[1], b[2]))
        nodes[node] = ("split", key, questions[key][q], children[0], children[1])
        objective += -neg_gain
        leaves += 1
        bar.update()
    bar.close()
    # number the leaves as pdfs, root by root in tree order
    pdf = 0
    stack = [roots[r] for r in sorted(roots, reverse=True)]
    while stack:
        i = stack.pop()
        if nodes[i][0] == "leaf":
            nodes[i] = ("leaf", pdf)
            pdf += 1
        else:
            stack.extend([nodes[i][4], nodes[i][3]])
    summary = {"leaves": pdf, "objective_before": start_objective, "objective_after": objective,
               "frames": float(data[:, 0].sum())}
    return Tree(nodes, roots, dict(root_of), pdf), summary
