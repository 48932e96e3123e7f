"""The BLSTM acoustic model of IBM's Switchboard systems.

Body: optional frame stacking (``stack_frames`` consecutive frames concatenated, the frame rate
divided by as much: used by CTC models), ``layers`` bidirectional LSTM layers of ``cells`` per
direction, then a linear bottleneck of ``bottleneck`` units. Head: a linear layer to the output
units — the CTC vocabulary (blank = 0) or the tied CD-HMM states (pdf ids) for frame CE.
IBM's system: 6 layers, 512 cells, 256 bottleneck, ~32k outputs (Zhang et al., ICASSP 2019).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class BLSTM(nn.Module):
    """Bidirectional LSTM stack with a linear bottleneck and an output layer."""

    def __init__(self, input_dim: int, output_dim: int, layers: int = 6, cells: int = 512,
                 bottleneck: int = 256, dropout: float = 0.0, stack_frames: int = 1) -> None:
        super().__init__()
        if layers < 1 or cells < 1 or output_dim < 1 or stack_frames < 1:
            raise ValueError(f"BLSTM needs positive sizes: layers={layers} cells={cells} "
                             f"output_dim={output_dim} stack_frames={stack_frames}")
        self.input_dim, self.output_dim, self.stack_frames = input_dim, output_dim, stack_frames
        self.lstm = nn.LSTM(input_dim * stack_frames, cells, num_layers=layers,
                            bidirectional=True, batch_first=True,
                            dropout=dropout if layers > 1 else 0.0)
        self.bottleneck = nn.Linear(2 * cells, bottleneck) if bottleneck else nn.Identity()
        self.output = nn.Linear(bottleneck or 2 * cells, output_dim)

    def subsampled_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return torch.div(lengths, self.stack_frames, rounding_mode="floor")

    def forward(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
        """``feats`` [batch, frames, dim] → (logits [batch, frames', output_dim], frames')."""
        if self.stack_frames > 1:
            b, t, d = feats.shape
            t2 = t // self.stack_frames
            feats = feats[:, : t2 * self.stack_frames].reshape(b, t2, d * self.stack_frames)
            lengths = self.subsampled_lengths(lengths)
        lengths = lengths.clamp(min=1)
        packed = pack_padded_sequence(feats, lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=feats.shape[1])
        return self.output(self.bottleneck(out)), lengths


def build_model(cfg: Mapping, input_dim: int, output_dim: int) -> BLSTM:
    """The model of ``cfg`` (the ``model`` config group)."""
    return BLSTM(input_dim, output_dim, layers=int(cfg["layers"]), cells=int(cfg["cells"]),
                 bottleneck=int(cfg.get("bottleneck", 256)), dropout=float(cfg.get("dropout", 0.0)),
                 stack_frames=int(cfg.get("stack_frames", 1)))
