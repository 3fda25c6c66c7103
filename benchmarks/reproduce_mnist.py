"""Reproduce Feldman & Zrnic (2021) Section 5.1 (MNIST, private GD with and without filtering) on the engine.

    python benchmarks/reproduce_mnist.py --help

The driver (cells, checkpoints, --park, --todo, --table, --plot) is
``fedfilter.simulations.reproduce.mnist_runs``; its tables are ``...reproduce.mnist_report``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from fedfilter.simulations.reproduce.mnist_runs import main  # noqa: E402

if __name__ == "__main__":
    main()
