"""pytorchexample: A Flower / PyTorch app.

Offline variant of Flower's quickstart-pytorch task: the data come from scikit-learn's bundled
handwritten digits (8x8 grey images, 10 classes) instead of CIFAR-10 through ``flwr_datasets``,
and the CNN takes 1x8x8 inputs. Everything else follows the template.
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader


class Net(nn.Module):
    """Model (the quickstart's small CNN, with padding so that 8x8 inputs fit)"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 2 * 2)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


SPLIT_SEED = 42  # the same split on the server and on every node


def _digits_splits():
    """The digits as ({"img", "label"} examples) for the federation and for central testing (20%)."""
    digits = load_digits()
    images = (digits.images.astype(np.float32) / 16.0 - 0.5) / 0.5  # like Normalize((0.5,), (0.5,))
    examples = [{"img": torch.from_numpy(img[None]), "label": int(label)} for img, label in zip(images, digits.target)]
    order = np.random.default_rng(SPLIT_SEED).permutation(len(examples))
    cut = int(0.8 * len(examples))
    return [examples[i] for i in order[:cut]], [examples[i] for i in order[cut:]]


def load_data(partition_id: int, num_partitions: int, batch_size: int):
    """Load one IID partition of the digits: 80% train, 20% test."""
    federated, _ = _digits_splits()
    partition = [federated[i] for i in range(partition_id, len(federated), num_partitions)]
    cut = int(0.8 * len(partition))
    trainloader = DataLoader(partition[:cut], batch_size=batch_size, shuffle=True)
    testloader = DataLoader(partition[cut:], batch_size=batch_size)
    return trainloader, testloader


def load_centralized_dataset():
    """Load the held-out test set and return its dataloader."""
    _, test_set = _digits_splits()
    return DataLoader(test_set, batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(dim=1) == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
