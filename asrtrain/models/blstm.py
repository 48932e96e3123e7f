"""The BLSTM acoustic model of IBM's Switchboard systems.

Body: optional frame stacking (``stack_frames`` consecutive frames concatenated, the frame rate
divided by as much: used by CTC models), ``layers`` bidirectional LSTM layers of ``cells`` per
direction, then a linear bottleneck of ``bottleneck`` units. Head: a linear layer to the output
units — the CTC vocabulary (blank = 0) or the tied CD-HMM states (pdf ids) for frame CE.
IBM's system: 6 layers, 512 cells, 256 bottleneck, ~32k outputs (Zhang et al., ICASSP 2019).

Each layer keeps one parameter layout, a forward and a backward ``nn.LSTM``
(``layers.N.forward_lstm.weight_ih_l0`` …), and runs it one of three ways, chosen per batch by
:func:`choose_layout`; all three give the same outputs and gradients (``tests/test_models.py``):

- ``bidirectional``: one bidirectional LSTM call over the padded batch, when every sequence fills
  it (hybrid chunks) — cuDNN's bidirectional kernel on GPUs, where it is 1.2-1.4x faster than
  two unidirectional calls (issue 11's H100 table); on CPUs the two cost the same.
- ``padded`` (CPUs, unequal lengths): each direction on the padded batch, the backward one on
  every utterance reversed within its own length. torch's CPU LSTM takes a slow path for packed
  batches whose utterances differ in length (measured here: a 3x192 training step 0.67 s packed,
  0.18 s padded).
- ``packed`` (GPUs, unequal lengths): one bidirectional call over a packed sequence, which cuDNN
  runs exactly for any lengths.

On GPUs the eight weights of a layer's two directions are made views of one buffer in cuDNN's
bidirectional layout (:meth:`BidirectionalLayer.flatten`, as ``nn.LSTM.flatten_parameters`` does
for its own), so cuDNN does not copy them at every call.
"""

from __future__ import annotations

import torch
from torch import _VF, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from asrtrain.models.config import BlstmConfig
from asrtrain.models.registry import register_model

LAYOUTS = ("bidirectional", "padded", "packed")


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse every sequence of ``x`` [batch, frames, dim] within its length; padding stays put."""
    b, t = x.shape[:2]
    idx = torch.arange(t, device=x.device).expand(b, t)
    rev = lengths.to(x.device).unsqueeze(1) - 1 - idx
    rev = torch.where(rev >= 0, rev, idx)
    return x.gather(1, rev.unsqueeze(-1).expand_as(x))


def choose_layout(lengths: torch.Tensor, frames: int, device: torch.device) -> str:
    """How a layer runs a batch of ``frames`` padded frames: ``bidirectional`` when every
    sequence is ``frames`` long, else ``packed`` on CUDA and ``padded`` elsewhere."""
    if bool((lengths == frames).all()):
        return "bidirectional"
    return "packed" if device.type == "cuda" else "padded"


def _weights(lstm: nn.LSTM) -> list[torch.Tensor]:
    return [lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0]


class BidirectionalLayer(nn.Module):
    """One BLSTM layer: a forward and a backward LSTM, outputs concatenated."""

    def __init__(self, input_dim: int, cells: int) -> None:
        super().__init__()
        self.cells = cells
        self.forward_lstm = nn.LSTM(input_dim, cells, batch_first=True)
        self.backward_lstm = nn.LSTM(input_dim, cells, batch_first=True)

    def weights(self) -> list[torch.Tensor]:
        """Both directions' weights in the order of a bidirectional LSTM's flat weights."""
        return _weights(self.forward_lstm) + _weights(self.backward_lstm)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, layout: str) -> torch.Tensor:
        if layout == "bidirectional":
            return self._bidirectional(x)
        if layout == "packed":
            return self._packed(x, lengths)
        return self._padded(x, lengths)

    def _zeros(self, x: torch.Tensor, directions: int, batch: int) -> list[torch.Tensor]:
        h = x.new_zeros(directions, batch, self.cells)
        return [h, h]

    def _bidirectional(self, x: torch.Tensor) -> torch.Tensor:
        self.flatten_if_moved()
        return _VF.lstm(x, self._zeros(x, 2, x.shape[0]), self.weights(), True, 1, 0.0,
                        self.training, True, True)[0]

    def _padded(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # Frames past an utterance's end come after its last frame in both directions, so they
        # never reach its outputs.
        h = self._zeros(x, 1, x.shape[0])
        fwd = _VF.lstm(x, h, _weights(self.forward_lstm), True, 1, 0.0, self.training, False,
                       True)[0]
        bwd = _VF.lstm(reverse_padded(x, lengths), h, _weights(self.backward_lstm), True, 1,
                       0.0, self.training, False, True)[0]
        return torch.cat([fwd, reverse_padded(bwd, lengths)], dim=-1)

    def _packed(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        self.flatten_if_moved()
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out = _VF.lstm(packed.data, packed.batch_sizes, self._zeros(x, 2, x.shape[0]),
                       self.weights(), True, 1, 0.0, self.training, True)[0]
        out = PackedSequence(out, packed.batch_sizes, packed.sorted_indices,
                             packed.unsorted_indices)
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]

    # ------------------------------------------------------------------ cuDNN's flat weights
    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)  # the two nn.LSTMs flatten their own weights first
        self.flatten()
        return out

    def flatten(self) -> None:
        """On CUDA with cuDNN, make the eight weights views of one buffer laid out as a
        bidirectional LSTM's, so cuDNN's bidirectional kernel reads them in place (otherwise it
        copies them into such a buffer at every call and warns). Elsewhere a no-op."""
        weights = self.weights()
        first = weights[0]
        if not (first.is_cuda and torch.backends.cudnn.is_acceptable(first)
                and all(w.dtype == first.dtype and w.is_cuda for w in weights)
                and len({w.data_ptr() for w in weights}) == len(weights)
                and torch._use_cudnn_rnn_flatten_weight()):
            self._flat_ptrs = None
            return
        from torch.backends.cudnn import rnn

        with torch.cuda.device_of(first), torch.no_grad():
            torch._cudnn_rnn_flatten_weight(weights, 4, self.forward_lstm.input_size,
                                            rnn.get_cudnn_mode("LSTM"), self.cells, 0, 1, True,
                                            True)
        self._flat_ptrs = tuple(w.data_ptr() for w in weights)

    def flatten_if_moved(self) -> None:
        """Flatten again when the weights moved (a parameter's storage was replaced)."""
        if self.forward_lstm.weight_ih_l0.is_cuda and getattr(self, "_flat_ptrs", None) != tuple(
                w.data_ptr() for w in self.weights()):
            self.flatten()


class BLSTM(nn.Module):
    """Bidirectional LSTM stack with a linear bottleneck and an output layer.

    ``layout``: ``auto`` (:func:`choose_layout` per batch) or one of :data:`LAYOUTS` for every
    batch (``packed`` and ``padded`` are exact for any batch; ``bidirectional`` only for batches
    whose sequences all fill the padded length)."""

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
        self.layout = "auto"

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
        frames = feats.shape[1]
        layout = (choose_layout(lengths, frames, feats.device) if self.layout == "auto"
                  else self.layout)
        if layout not in LAYOUTS:
            raise ValueError(f"BLSTM.layout={layout!r}: expected auto or one of "
                             f"{', '.join(LAYOUTS)}")
        out = feats
        for i, layer in enumerate(self.layers):
            out = layer(self.dropout(out) if i else out, lengths, layout)
        if layout != "bidirectional":
            valid = torch.arange(frames, device=out.device) < lengths.to(out.device)[:, None]
            out = out * valid.unsqueeze(-1)
        # Under autocast (trainer.precision=bf16) the layers run in bf16; the logits the loss
        # reads are fp32, so log-softmax, CTC and cross-entropy sum in fp32 (a no-op in fp32).
        return self.output(self.bottleneck(out)).float(), lengths


@register_model("blstm", config=BlstmConfig)
def build_blstm(cfg: BlstmConfig, input_dim: int, output_dim: int, head: str = "ctc") -> BLSTM:
    """``model.arch=blstm`` (the default): the BLSTM of ``cfg`` (:class:`BlstmConfig`:
    ``layers``, ``cells``, ``bottleneck``, ``dropout``, ``stack_frames``), for either head."""
    return BLSTM(input_dim, output_dim, layers=cfg.layers, cells=cfg.cells,
                 bottleneck=cfg.bottleneck, dropout=cfg.dropout, stack_frames=cfg.stack_frames)
