"""The BLSTM's three ways to run a layer (one bidirectional call, two unidirectional calls on the
padded batch, one bidirectional call on a packed sequence) equal each other and torch's packed
BLSTM, outputs and gradients, on one parameter layout that checkpoints keep."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from asrtrain.models.blstm import BLSTM, choose_layout, reverse_padded


def packed_reference(model: BLSTM, feats: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The same weights in one bidirectional ``nn.LSTM`` over a packed sequence."""
    layers = len(model.layers)
    cells = model.layers[0].forward_lstm.hidden_size
    ref = nn.LSTM(feats.shape[-1], cells, num_layers=layers, bidirectional=True,
                  batch_first=True)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            for suffix, lstm in (("", layer.forward_lstm), ("_reverse", layer.backward_lstm)):
                for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                    getattr(ref, f"{name}_l{i}{suffix}").copy_(getattr(lstm, f"{name}_l0"))
    packed = pack_padded_sequence(feats, lengths, batch_first=True, enforce_sorted=False)
    out, _ = ref(packed)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=feats.shape[1])
    return model.output(model.bottleneck(out))


def test_reverse_padded_keeps_padding_in_place() -> None:
    x = torch.arange(8.0).reshape(2, 4, 1)
    out = reverse_padded(x, torch.tensor([4, 2]))
    assert out[:, :, 0].tolist() == [[3, 2, 1, 0], [5, 4, 6, 7]]
    assert torch.equal(reverse_padded(out, torch.tensor([4, 2])), x)


@pytest.mark.parametrize("layers", [1, 3])
def test_blstm_equals_packed_bidirectional_lstm(layers: int) -> None:
    torch.manual_seed(0)
    model = BLSTM(5, 7, layers=layers, cells=6, bottleneck=4)
    lengths = torch.tensor([9, 4, 7, 1])
    feats = torch.randn(4, 9, 5)
    logits, out_lengths = model(feats, lengths)
    expected = packed_reference(model, feats, lengths)
    assert out_lengths.tolist() == lengths.tolist()
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    # padded frames carry the output layer's value of a zero vector, as pad_packed_sequence gives
    pad = model.output(model.bottleneck(torch.zeros(6 * 2)))
    torch.testing.assert_close(logits[1, 4:], pad.expand(5, 7))
    # gradients agree too, and no real frame's loss reaches a padded frame's input
    mask = (torch.arange(9) < lengths[:, None]).unsqueeze(-1)
    feats.requires_grad_(True)
    g1 = torch.autograd.grad((model(feats, lengths)[0] * mask).sum(), feats)[0]
    g2 = torch.autograd.grad((packed_reference(model, feats, lengths) * mask).sum(), feats)[0]
    torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(g1[1, 4:]) == 0


def test_blstm_stacks_frames() -> None:
    torch.manual_seed(0)
    model = BLSTM(2, 3, layers=2, cells=4, bottleneck=0, stack_frames=3)
    feats = torch.randn(2, 10, 2)
    logits, out_lengths = model(feats, torch.tensor([10, 5]))
    assert logits.shape == (2, 3, 3) and out_lengths.tolist() == [3, 1]
    stacked = feats[:, :9].reshape(2, 3, 6)
    expected = packed_reference(model, stacked, torch.tensor([3, 1]))
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def _outputs_and_gradients(model: BLSTM, layout: str, feats: torch.Tensor,
                           lengths: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Logits and the gradients of a masked loss for every parameter and the input."""
    model.layout = layout
    model.zero_grad()
    feats = feats.clone().requires_grad_(True)
    logits, _ = model(feats, lengths)
    frames = torch.arange(feats.shape[1], device=feats.device)
    mask = (frames < lengths.to(feats.device)[:, None]).unsqueeze(-1)
    (logits.tanh() * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logits.detach(), {**grads, "input": feats.grad}


@pytest.mark.parametrize(("case", "lengths", "layouts"), [
    ("chunks", [21, 21, 21, 21, 21], ["bidirectional", "padded", "packed"]),
    ("padded", [21, 9, 17, 1, 21], ["padded", "packed"]),
])
def test_layouts_give_equal_outputs_and_gradients(case: str, lengths: list[int],
                                                  layouts: list[str]) -> None:
    torch.manual_seed(0)
    model = BLSTM(6, 11, layers=3, cells=8, bottleneck=5, dropout=0.0)
    lengths_t = torch.tensor(lengths)
    feats = torch.randn(len(lengths), 21, 6)
    ref_logits, ref_grads = _outputs_and_gradients(model, layouts[0], feats, lengths_t)
    assert all(g.abs().sum() > 0 for g in ref_grads.values())
    for layout in layouts[1:]:
        logits, grads = _outputs_and_gradients(model, layout, feats, lengths_t)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5, msg=layout)
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-5,
                                       msg=f"{layout}: {name}")
    # the automatic choice takes the first of each case on this CPU
    model.layout = "auto"
    torch.testing.assert_close(model(feats, lengths_t)[0], ref_logits, rtol=0, atol=0)
    assert choose_layout(lengths_t, 21, torch.device("cpu")) == layouts[0]


def test_layout_chosen_by_device_and_lengths() -> None:
    equal, unequal = torch.tensor([21, 21]), torch.tensor([21, 20])
    assert choose_layout(equal, 21, torch.device("cpu")) == "bidirectional"
    assert choose_layout(equal, 21, torch.device("cuda", 0)) == "bidirectional"
    assert choose_layout(unequal, 21, torch.device("cpu")) == "padded"
    assert choose_layout(unequal, 21, torch.device("cuda", 0)) == "packed"
    model = BLSTM(3, 4, layers=1, cells=2, bottleneck=0)
    model.layout = "cudnn"
    with pytest.raises(ValueError, match="BLSTM.layout='cudnn'"):
        model(torch.zeros(1, 2, 3), torch.tensor([2]))


def test_parameter_layout_is_the_checkpoints_one() -> None:
    """Checkpoints written before the bidirectional call was added load as they are: the
    parameters keep their names (the two directions of each layer)."""
    model = BLSTM(5, 7, layers=2, cells=6, bottleneck=4)
    lstm_keys = {k for k in model.state_dict() if k.startswith("layers.")}
    assert lstm_keys == {f"layers.{i}.{d}.{w}_l0" for i in range(2)
                         for d in ("forward_lstm", "backward_lstm")
                         for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}


@pytest.mark.cuda
@pytest.mark.parametrize("lengths", [[21, 21, 21, 21], [21, 9, 17, 1]])
def test_cuda_layouts_equal_the_cpu_padded_path(device: torch.device,
                                                lengths: list[int]) -> None:
    """On a GPU: chunks through cuDNN's bidirectional kernel, unequal lengths through a packed
    sequence; both equal the CPU's padded path (to TF32/cuDNN rounding), with the weights read
    in place (cuDNN warns when it must copy weights that are not one flat buffer)."""
    import copy
    import warnings

    torch.manual_seed(0)
    model = BLSTM(6, 11, layers=3, cells=8, bottleneck=5)
    lengths_t = torch.tensor(lengths)
    feats = torch.randn(len(lengths), 21, 6)
    ref_logits, ref_grads = _outputs_and_gradients(model, "padded", feats, lengths_t)
    gpu = copy.deepcopy(model).to(device)
    layout = choose_layout(lengths_t, 21, device)
    assert layout == ("bidirectional" if min(lengths) == 21 else "packed")
    with warnings.catch_warnings():
        # cuDNN's "RNN module weights are not part of single contiguous chunk of memory"
        warnings.filterwarnings("error", message=".*single contiguous chunk.*")
        logits, grads = _outputs_and_gradients(gpu, "auto", feats.to(device), lengths_t)
        again = copy.deepcopy(gpu)  # the copy's weights are flattened anew on first use
        again.layout = "auto"
        torch.testing.assert_close(again(feats.to(device), lengths_t)[0], logits)
    torch.testing.assert_close(logits.cpu(), ref_logits, rtol=2e-3, atol=2e-3)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name].cpu(), g, rtol=2e-3, atol=2e-3, msg=name)
