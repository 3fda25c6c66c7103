"""UCI Adult (Census Income): tabular binary classification, label ``>50K``."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from .paths import dataset_dir

COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
)  # followed by the label column
NUMERIC = (
    "age",
    "fnlwgt",
    "education-num",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
)
CATEGORICAL = tuple(c for c in COLUMNS if c not in NUMERIC)
MISSING = "?"  # how the UCI files write a missing value
POSITIVE, NEGATIVE = ">50K", "<=50K"


def _parse(path: Path) -> tuple[list[list[str]], np.ndarray]:
    rows, labels = [], []
    with open(path, encoding="ascii") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            # adult.test starts with "|1x3 Cross validator"; both files end
            # with blank lines.
            if not line or line.startswith("|"):
                continue
            fields = [v.strip() for v in line.split(",")]
            if len(fields) != len(COLUMNS) + 1:
                raise ValueError(f"{path}:{lineno}: {len(fields)} fields, expected {len(COLUMNS) + 1}")
            label = fields[-1].rstrip(".")  # adult.test labels end with "."
            if label not in (POSITIVE, NEGATIVE):
                raise ValueError(f"{path}:{lineno}: unknown label {fields[-1]!r}")
            rows.append(fields[:-1])
            labels.append(label == POSITIVE)
    return rows, np.asarray(labels, dtype=np.int64)


def _column(rows: list[list[str]], name: str) -> list[str]:
    j = COLUMNS.index(name)
    return [r[j] for r in rows]


def _encode(rows, categories, means, stds) -> np.ndarray:
    parts = []
    for name in NUMERIC:
        values = np.asarray(_column(rows, name), dtype=np.float64)
        parts.append(((values - means[name]) / stds[name])[:, None])
    for name in CATEGORICAL:
        index = {c: k for k, c in enumerate(categories[name])}
        onehot = np.zeros((len(rows), len(index)))
        for i, value in enumerate(_column(rows, name)):
            k = index.get(value)
            if k is not None:  # a category never seen in train stays all-zero
                onehot[i, k] = 1.0
        parts.append(onehot)
    return np.hstack(parts).astype(np.float32)


def load_adult(
    data_dir: str | os.PathLike | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r"""Load Adult: 32,561 train rows (``adult.data``), 16,281 test rows.

    Numeric columns are standardised with TRAIN mean and std only (no test
    leakage). Categorical columns are one-hot over the categories seen in
    train, sorted; a missing value ``?`` is kept as its own category, since
    missingness is informative and dropping rows would change the data set.

    Parameters
    ----------
    data_dir : str or PathLike, optional
        Root of the offline data (holding ``adult/``); default
        :func:`fedfilter.simulations.tasks.paths.data_dir`.

    Returns
    -------
    x_train, y_train, x_test, y_test : numpy.ndarray
        float32 features (N, 108 for the original files), int64 labels with
        1 for ``>50K``. Read-only (cached and shared).

    Examples
    --------
    A root holding an ``adult/`` folder of two training rows and one test row:

    >>> import tempfile
    >>> row = "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 0, 0, 40, "
    >>> with tempfile.TemporaryDirectory() as d:
    ...     (Path(d) / "adult").mkdir()
    ...     _ = Path(d, "adult", "adult.data").write_text(row + "Cuba, <=50K\n" + row + "?, >50K\n")
    ...     _ = Path(d, "adult", "adult.test").write_text("|1x3 Cross validator\n" + row + "Cuba, >50K.\n")
    ...     x_train, y_train, x_test, y_test = load_adult(d)
    >>> x_train.shape, y_train.tolist(), y_test.tolist()
    ((2, 15), [0, 1], [1])
    """
    return _load(str(dataset_dir(data_dir, "adult")))[:4]


def adult_feature_names(data_dir: str | os.PathLike | None = None) -> list[str]:
    r"""Names of the columns of :func:`load_adult`'s features, in order.

    Parameters
    ----------
    data_dir : str or PathLike, optional
        Root of the offline data (holding ``adult/``).

    Returns
    -------
    list of str
        The numeric columns, then ``column=category`` for each one-hot column.

    Examples
    --------
    >>> import tempfile
    >>> row = "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 0, 0, 40, "
    >>> with tempfile.TemporaryDirectory() as d:
    ...     (Path(d) / "adult").mkdir()
    ...     _ = Path(d, "adult", "adult.data").write_text(row + "Cuba, <=50K\n" + row + "?, >50K\n")
    ...     _ = Path(d, "adult", "adult.test").write_text(row + "Cuba, >50K.\n")
    ...     names = adult_feature_names(d)
    >>> names[0], names[-2:]
    ('age', ['native-country=?', 'native-country=Cuba'])
    """
    return list(_load(str(dataset_dir(data_dir, "adult")))[4])


@lru_cache(maxsize=2)
def _load(folder: str):
    train_rows, y_train = _parse(Path(folder, "adult.data"))
    test_rows, y_test = _parse(Path(folder, "adult.test"))
    means, stds, categories = {}, {}, {}
    for name in NUMERIC:
        values = np.asarray(_column(train_rows, name), dtype=np.float64)
        means[name] = values.mean()
        stds[name] = values.std() or 1.0  # guard a constant column
    for name in CATEGORICAL:
        categories[name] = sorted(set(_column(train_rows, name)))
    x_train = _encode(train_rows, categories, means, stds)
    x_test = _encode(test_rows, categories, means, stds)
    names = tuple(NUMERIC) + tuple(f"{name}={c}" for name in CATEGORICAL for c in categories[name])
    for a in (x_train, y_train, x_test, y_test):
        a.flags.writeable = False
    return x_train, y_train, x_test, y_test, names
