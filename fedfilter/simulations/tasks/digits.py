"""scikit-learn's bundled 8x8 handwritten digits: the default demo data set.

It ships inside scikit-learn, so the demo works on a fresh machine without
the offline data folder.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

TEST_FRACTION = 0.2
SPLIT_SEED = 0  # fixed so every run and every client sees the same split


@lru_cache(maxsize=1)
def load_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load the 1,797 digits with a fixed stratified 80/20 split.

    Returns
    -------
    x_train, y_train, x_test, y_test : numpy.ndarray
        Features are float32 of shape (N, 64) scaled to [0, 1] (raw pixel
        values are 0..16); labels are int64 in 0..9. Arrays are read-only
        because they are cached and shared.

    Examples
    --------
    >>> x_train, y_train, x_test, y_test = load_digits()
    >>> x_train.shape, x_test.shape, x_train.flags.writeable
    ((1437, 64), (360, 64), False)
    """
    from sklearn.datasets import load_digits as _sk_load_digits
    from sklearn.model_selection import train_test_split

    bunch = _sk_load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    parts = train_test_split(x, y, test_size=TEST_FRACTION, stratify=y, random_state=SPLIT_SEED)
    x_train, x_test, y_train, y_test = (np.ascontiguousarray(a) for a in parts)
    for a in (x_train, y_train, x_test, y_test):
        a.flags.writeable = False
    return x_train, y_train, x_test, y_test
