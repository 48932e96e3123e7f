"""The BLSTM acoustic model of IBM's Switchboard systems.

Body: optional frame stacking (``stack_frames`` consecutive frames concatenated, the frame rate
divided by as much: used by CTC models), ``layers`` bidirectional LSTM layers of ``cells`` per
direction, then a linear bottleneck of ``bottleneck`` units. Head: a linear layer to the output
units — the CTC vocabulary (blank = 0) or the tied CD-HMM states (pdf ids) for frame CE.
IBM's system: 6 layers, 512 cells, 256 bottleneck, ~32k outputs (Zhang et al., ICASSP 2019).

Each layer runs its two directions on the padded batch, the backward one on every utterance
reversed within its own length, instead of one ``nn.LSTM`` over a packed sequence. The result is
the same, and on CPUs it is 3-4x faster: torch's CPU LSTM takes a slow path for packed batches
whose utterances differ in length (measured here: a 3x192 training step 0.67 s packed, 0.18 s
padded; ``tests/test_models.py`` checks the outputs agree).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import nn


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse every sequence of ``x`` [batch, frames, dim] within its length; padding stays put."""
    b, t = x.shape[:2]
    idx = torch.arange(t, device=x.device).expand(b, t)
    rev = lengths.to(x.device).unsqueeze(1) - 1 - idx
    rev = torch.where(rev >= 0, rev, idx)
    return x.gather(1, rev.unsqueeze(-1).expand_as(x))


class BidirectionalLayer(nn.Module):
    """One BLSTM layer: a forward and a backward LSTM, outputs concatenated."""

    def __init__(self, input_dim: int, cells: int) -> None:
        super().__init__()
        self.forward_lstm = nn.LSTM(input_dim, cells, batch_first=True)
        self.backward_lstm = nn.LSTM(input_dim, cells, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # Frames past an utterance's end come after its last frame in both directions, so they
        # never reach its outputs.
        fwd, _ = self.forward_lstm(x)
        bwd, _ = self.backward_lstm(reverse_padded(x, lengths))
        return torch.cat([fwd, reverse_padded(bwd, lengths)], dim=-1)


class BLSTM(nn.Module):
    """Bidirectional LSTM stack with a linear bottleneck and an output layer."""

    def __init__(self, input_dim: int, output_dim: int, layers: int = 6, cells: int = 512,
                 bottleneck: int = 256, dropout: float = 0.0, stack_frames: int = 1) -> None:
        super().__init__()
        if layers < 1 or cells < 1 or output_dim < 1 or stack_frames < 1:
            raise ValueError(f"BLSTM needs positive sizes: layers={layers} cells={cells} "
                             f"output_dim={output_dim} stack_frames={stack_frames}")
        self.input_dim, self.output_dim, self.stack_frames = input_dim, output_dim, stack_frames
        self.layers = nn.ModuleList(
            BidirectionalLayer(input_dim * stack_frames if i == 0 else 2 * cells, cells)
            for i in range(layers))
        # as nn.LSTM's dropout: on the outputs of every layer but the last
        self.dropout = nn.Dropout(dropout)
        self.bottleneck = nn.Linear(2 * cells, bottleneck) if bottleneck else nn.Identity()
        self.output = nn.Linear(bottleneck or 2 * cells, output_dim)
        self._register_load_state_dict_pre_hook(_from_packed_lstm_keys)

    def subsampled_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return torch.div(lengths, self.stack_frames, rounding_mode="floor")

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
        """``feats`` [batch, frames, dim] → (logits [batch, frames', output_dim], frames').

        Outputs past each utterance's ``frames'`` are zero."""
        if self.stack_frames > 1:
            b, t, d = feats.shape
            t2 = t // self.stack_frames
            feats = feats[:, : t2 * self.stack_frames].reshape(b, t2, d * self.stack_frames)
            lengths = self.subsampled_lengths(lengths)
        lengths = lengths.clamp(min=1)
        out = feats
        for i, layer in enumerate(self.layers):
            out = layer(self.dropout(out) if i else out, lengths)
        valid = torch.arange(out.shape[1], device=out.device) < lengths.to(out.device)[:, None]
        out = out * valid.unsqueeze(-1)
        return self.output(self.bottleneck(out)), lengths


PACKED_KEY = re.compile(r"^lstm\.(weight_ih|weight_hh|bias_ih|bias_hh)_l(\d+)(_reverse)?$")


def _from_packed_lstm_keys(state_dict: dict, prefix: str, *args) -> None:
    """Rename the parameters of checkpoints written when the model was one packed ``nn.LSTM``
    (``lstm.weight_ih_l1_reverse`` → ``layers.1.backward_lstm.weight_ih_l0``), in place."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        m = PACKED_KEY.match(key[len(prefix):])
        if m:
            name, layer, reverse = m.groups()
            direction = "backward_lstm" if reverse else "forward_lstm"
            state_dict[f"{prefix}layers.{layer}.{direction}.{name}_l0"] = state_dict.pop(key)


def build_model(cfg: Mapping, input_dim: int, output_dim: int) -> BLSTM:
    """The model of ``cfg`` (the ``model`` config group)."""
    return BLSTM(input_dim, output_dim, layers=int(cfg["layers"]), cells=int(cfg["cells"]),
                 bottleneck=int(cfg.get("bottleneck", 256)), dropout=float(cfg.get("dropout", 0.0)),
                 stack_frames=int(cfg.get("stack_frames", 1)))
