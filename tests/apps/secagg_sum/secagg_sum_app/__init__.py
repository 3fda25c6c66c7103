"""Test-only Flower app: the exact SecAgg+ sum of distributed noise under the Simulation Engine."""

import os
from pathlib import Path

PROBE_DIR_ENV = "FEDFILTER_TEST_SECAGG_PROBE_DIR"
SHAPES = [(8, 16), (16,)]  # a tiny numpy "model": 144 coordinates
KEYS = ["w", "b"]


def probe_dir() -> Path:
    """Where the probe and the spy write; the test sets it in the SuperLink's environment."""
    value = os.environ.get(PROBE_DIR_ENV, "")
    if not value:
        raise RuntimeError(f"{PROBE_DIR_ENV} is not set in this process's environment.")
    return Path(value)
