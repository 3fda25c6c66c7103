"""Small torch models for the built-in tasks.

All return class logits of shape (batch, num_classes), so every task trains
with cross-entropy. No BatchNorm anywhere: it mixes samples of a batch, which
breaks per-sample reasoning under differential privacy.
"""

from __future__ import annotations

import torch
from torch import nn

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _activation(name: str) -> type[nn.Module]:
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[name]


class DigitsMLP(nn.Sequential):
    """MLP for 8x8 digits: 64 -> ``hidden`` -> 10 (input (N, 64) or (N, 1, 8, 8)).

    Parameters
    ----------
    hidden : int, optional
        Hidden units.
    num_classes : int, optional
        Logits per sample.

    Examples
    --------
    >>> DigitsMLP()(torch.zeros(5, 64)).shape
    torch.Size([5, 10])
    """

    def __init__(self, hidden: int = 32, num_classes: int = 10):
        super().__init__(
            nn.Flatten(),
            nn.Linear(64, hidden),
            nn.Tanh(),
            nn.Linear(hidden, num_classes),
        )


class MnistCNN(nn.Sequential):
    """The small CNN of the DP-SGD MNIST literature, input (N, 1, 28, 28).

    Same layers as Opacus' ``examples/mnist.py`` ``SampleConvNet`` (26,010
    parameters). Opacus uses ReLU there; the default here is tanh, as in
    Papernot et al. (2021, tempered sigmoids) and Tramer & Boneh (2021),
    because bounded activations train better under gradient clipping.
    ``activation="relu"`` gives Opacus' network exactly.

    Parameters
    ----------
    activation : str, optional
        ``tanh`` or ``relu``.
    num_classes : int, optional
        Logits per sample.

    Examples
    --------
    >>> model = MnistCNN()
    >>> model(torch.zeros(2, 1, 28, 28)).shape, sum(p.numel() for p in model.parameters())
    (torch.Size([2, 10]), 26010)
    """

    def __init__(self, activation: str = "tanh", num_classes: int = 10):
        act = _activation(activation)
        super().__init__(
            nn.Conv2d(1, 16, 8, stride=2, padding=3),  # -> 16 x 14 x 14
            act(),
            nn.MaxPool2d(2, 1),  # -> 16 x 13 x 13
            nn.Conv2d(16, 32, 4, stride=2),  # -> 32 x 5 x 5
            act(),
            nn.MaxPool2d(2, 1),  # -> 32 x 4 x 4
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 32),
            act(),
            nn.Linear(32, num_classes),
        )


class QuickstartCNN(nn.Sequential):
    """Flower's quickstart-pytorch CNN (its ``task.py`` ``Net``: two 5x5 convolutions with max pooling,
    then three linear layers, ReLU) for 1 x 28 x 28 images: the model a new Flower user starts from.

    The template takes 3 x 32 x 32 CIFAR-10 images; on MNIST the first convolution takes one channel
    and the first linear layer 16 x 4 x 4 inputs (44,426 parameters).

    Parameters
    ----------
    num_classes : int, optional
        Logits per sample.

    Examples
    --------
    >>> model = QuickstartCNN()
    >>> model(torch.zeros(2, 1, 28, 28)).shape, sum(p.numel() for p in model.parameters())
    (torch.Size([2, 10]), 44426)
    """

    def __init__(self, num_classes: int = 10):
        super().__init__(
            nn.Conv2d(1, 6, 5),  # -> 6 x 24 x 24
            nn.ReLU(),
            nn.MaxPool2d(2, 2),  # -> 6 x 12 x 12
            nn.Conv2d(6, 16, 5),  # -> 16 x 8 x 8
            nn.ReLU(),
            nn.MaxPool2d(2, 2),  # -> 16 x 4 x 4
            nn.Flatten(),
            nn.Linear(16 * 4 * 4, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )


class LogisticRegression(nn.Module):
    """Binary logistic regression on ``d`` features (d + 1 parameters).

    Returns the two-class logits ``[0, w.x + b]``: softmax of these is
    ``[1 - sigmoid(z), sigmoid(z)]``, so cross-entropy on them is exactly the
    logistic loss, while the output format matches the other models.

    Parameters
    ----------
    d : int
        The number of features.

    Examples
    --------
    >>> model = LogisticRegression(3)
    >>> model(torch.zeros(4, 3)).shape, sum(p.numel() for p in model.parameters())
    (torch.Size([4, 2]), 4)
    """

    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The two-class logits ``[0, w.x + b]`` of a batch.

        Parameters
        ----------
        x : torch.Tensor
            Features, shape (N, d).

        Returns
        -------
        torch.Tensor
            Logits, shape (N, 2); the first column is 0.

        Examples
        --------
        >>> LogisticRegression(3)(torch.ones(1, 3))[0, 0].item()
        0.0
        """
        z = self.linear(x)
        return torch.cat([torch.zeros_like(z), z], dim=1)


class FemnistCNN(nn.Sequential):
    """Small 2-conv network for 28x28 FEMNIST characters (62 classes).

    A slimmer version of LEAF's FEMNIST CNN (32/64 channels, 2048 hidden,
    6.6M parameters): 16/32 channels and 128 hidden, about 222k parameters,
    to keep DP noise (which grows with dimension) and CPU time small.

    Parameters
    ----------
    num_classes : int, optional
        Logits per sample.
    activation : str, optional
        ``tanh`` or ``relu``.

    Examples
    --------
    >>> FemnistCNN()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 62])
    """

    def __init__(self, num_classes: int = 62, activation: str = "tanh"):
        act = _activation(activation)
        super().__init__(
            nn.Conv2d(1, 16, 5, padding=2),  # -> 16 x 28 x 28
            act(),
            nn.MaxPool2d(2),  # -> 16 x 14 x 14
            nn.Conv2d(16, 32, 5, padding=2),  # -> 32 x 14 x 14
            act(),
            nn.MaxPool2d(2),  # -> 32 x 7 x 7
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 128),
            act(),
            nn.Linear(128, num_classes),
        )


class CharLSTM(nn.Module):
    """Next-character model: embedding + LSTM, logits from the last step.

    LEAF's Shakespeare model is the same shape with 2 x 256 LSTM units; the
    defaults here are smaller for CPU simulations. Input: int64 ids
    (N, seq_len); output: (N, vocab_size).

    Parameters
    ----------
    vocab_size : int, optional
        Characters (logits per sample).
    embed_dim : int, optional
        Embedding size.
    hidden_size : int, optional
        LSTM units per layer.
    num_layers : int, optional
        LSTM layers.

    Examples
    --------
    >>> CharLSTM(hidden_size=16)(torch.zeros(3, 80, dtype=torch.int64)).shape
    torch.Size([3, 81])
    """

    def __init__(
        self,
        vocab_size: int = 81,
        embed_dim: int = 8,
        hidden_size: int = 128,
        num_layers: int = 2,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The next-character logits after the last step of each sequence.

        Parameters
        ----------
        x : torch.Tensor
            int64 character ids, shape (N, seq_len).

        Returns
        -------
        torch.Tensor
            Logits, shape (N, vocab_size).

        Examples
        --------
        >>> CharLSTM(vocab_size=5, hidden_size=4)(torch.zeros(2, 7, dtype=torch.int64)).shape
        torch.Size([2, 5])
        """
        out, _ = self.lstm(self.embedding(x))
        return self.head(out[:, -1, :])
