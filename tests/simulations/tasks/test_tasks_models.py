"""Model shapes and the torch-only training helpers."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fedfilter.simulations.tasks.models import CharLSTM, DigitsMLP, FemnistCNN, LogisticRegression, MnistCNN
from fedfilter.simulations.tasks.training import evaluate, get_weights, local_update, set_weights


@pytest.mark.parametrize(
    "model, x, classes",
    [
        (DigitsMLP(), torch.zeros(3, 64), 10),
        (DigitsMLP(), torch.zeros(3, 1, 8, 8), 10),
        (MnistCNN(), torch.zeros(3, 1, 28, 28), 10),
        (MnistCNN("relu"), torch.zeros(3, 1, 28, 28), 10),
        (LogisticRegression(108), torch.zeros(3, 108), 2),
        (FemnistCNN(), torch.zeros(3, 1, 28, 28), 62),
        (CharLSTM(), torch.zeros(3, 80, dtype=torch.long), 81),
    ],
)
def test_forward_shapes(model, x, classes):
    assert model(x).shape == (3, classes)


def test_mnist_cnn_has_the_opacus_layers():
    model = MnistCNN()
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(16, 1, 8, 8), (16,), (32, 16, 4, 4), (32,), (32, 512), (32,), (10, 32), (10,)]
    assert sum(p.numel() for p in model.parameters()) == 26010
    assert any(isinstance(m, torch.nn.Tanh) for m in model)
    assert any(isinstance(m, torch.nn.ReLU) for m in MnistCNN("relu"))
    with pytest.raises(ValueError, match="activation"):
        MnistCNN("gelu")


def test_logistic_regression_is_the_logistic_loss():
    torch.manual_seed(0)
    model, x = LogisticRegression(5), torch.randn(7, 5)
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    z = model.linear(x).squeeze(1)
    expected = F.binary_cross_entropy_with_logits(z, y.float())
    assert torch.allclose(F.cross_entropy(model(x), y), expected, atol=1e-6)
    assert sum(p.numel() for p in model.parameters()) == 6


def _data(seed=0, n=50):
    rng = np.random.default_rng(seed)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


def _model():
    torch.manual_seed(0)
    return DigitsMLP()


def test_weights_round_trip_and_checks():
    model = _model()
    weights = get_weights(model)
    assert [w.shape for w in weights] == [tuple(v.shape) for v in model.state_dict().values()]
    other = DigitsMLP()
    set_weights(other, weights)
    assert all(np.array_equal(a, b) for a, b in zip(get_weights(other), weights))
    with pytest.raises(ValueError, match="arrays"):
        set_weights(other, weights[:-1])
    with pytest.raises(ValueError, match="shape"):
        set_weights(other, [w.T for w in weights])


def test_local_update_is_a_nonzero_deterministic_delta():
    x, y = _data()
    model = _model()
    before = get_weights(model)
    delta = local_update(model, x, y, epochs=2, lr=0.1, batch_size=8, seed=7)
    assert [d.shape for d in delta] == [w.shape for w in before]
    assert all(d.dtype == np.float32 for d in delta)
    assert all(np.abs(d).sum() > 0 for d in delta)
    # The model is trained in place: new weights = old + delta.
    for b, a, d in zip(before, get_weights(model), delta):
        np.testing.assert_allclose(a, b + d, atol=1e-6)
    same = local_update(_model(), x, y, epochs=2, lr=0.1, batch_size=8, seed=7)
    other = local_update(_model(), x, y, epochs=2, lr=0.1, batch_size=8, seed=8)
    assert all(np.array_equal(a, b) for a, b in zip(delta, same))
    assert not all(np.array_equal(a, b) for a, b in zip(delta, other))


def test_local_update_reduces_loss_and_rejects_bad_arguments():
    x, y = _data()
    model = _model()
    loss_before, _ = evaluate(model, x, y)
    local_update(model, x, y, epochs=20, lr=0.5, batch_size=10, seed=0)
    loss_after, accuracy = evaluate(model, x, y, batch_size=7)
    assert loss_after < loss_before and 0.0 <= accuracy <= 1.0
    for bad in (dict(epochs=0), dict(batch_size=0), dict(lr=0.0)):
        args = dict(epochs=1, lr=0.1, batch_size=8, seed=0) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            local_update(model, x, y, **args)
    with pytest.raises(ValueError):
        local_update(model, x[:0], y[:0], epochs=1, lr=0.1, batch_size=8, seed=0)


def test_training_on_read_only_windowed_text():
    ids = np.random.default_rng(0).integers(0, 81, 200)
    ids.flags.writeable = False
    x = np.lib.stride_tricks.sliding_window_view(ids[:-1], 80)
    y = ids[80:]
    torch.manual_seed(0)
    model = CharLSTM(hidden_size=16, num_layers=1)
    delta = local_update(model, x, y, epochs=1, lr=0.5, batch_size=32, seed=0)
    assert any(np.abs(d).sum() > 0 for d in delta)
    loss, _ = evaluate(model, x, y)
    assert np.isfinite(loss)


def test_training_module_imports_no_data_libraries():
    code = (
        "import sys, fedfilter.simulations.tasks.training; "
        "bad = [m for m in ('sklearn', 'h5py', 'flwr') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
