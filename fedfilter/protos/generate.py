"""Regenerate the Python code for ``protos/fedfilter.proto``.

Usage (from the repository root, or with the path adjusted)::

    python fedfilter/protos/generate.py            # rewrite fedfilter/protos/fedfilter_pb2*.py{,i} in place
    python fedfilter/protos/generate.py --out DIR  # write them to DIR instead (the drift test does this)

Runs ``grpc_tools.protoc`` with ``-I`` this directory, then turns the generated ``import fedfilter_pb2``
of the gRPC module into ``from fedfilter.protos import fedfilter_pb2`` so the code imports as
``fedfilter.protos.fedfilter_pb2`` / ``fedfilter.protos.fedfilter_pb2_grpc``. The output depends on the installed
grpcio-tools version; the committed files were made with the one in the project's virtualenv.

Constants: ``PROTO_DIR`` (this directory), ``PROTO_NAME`` (the ``.proto`` file) and ``GENERATED``
(the three files written).

Examples
--------
>>> GENERATED
('fedfilter_pb2.py', 'fedfilter_pb2.pyi', 'fedfilter_pb2_grpc.py')
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROTO_NAME = "fedfilter.proto"
GENERATED = ("fedfilter_pb2.py", "fedfilter_pb2.pyi", "fedfilter_pb2_grpc.py")

_BARE_IMPORT = "import fedfilter_pb2 as fedfilter__pb2\n"
_PACKAGE_IMPORT = "from fedfilter.protos import fedfilter_pb2 as fedfilter__pb2\n"


def generate(out_dir: Path = PROTO_DIR) -> list[Path]:
    """Write the generated modules into ``out_dir`` and return their paths.

    Parameters
    ----------
    out_dir : pathlib.Path, optional
        Where to write (created if missing); default ``PROTO_DIR``, in place.

    Returns
    -------
    list of pathlib.Path
        The paths of the ``GENERATED`` files.

    Raises
    ------
    RuntimeError
        If ``protoc`` fails, or its gRPC module no longer has the one import line this rewrites.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     paths = generate(Path(tmp))
    ...     [p.name for p in paths], "from fedfilter.protos import" in paths[2].read_text()
    (['fedfilter_pb2.py', 'fedfilter_pb2.pyi', 'fedfilter_pb2_grpc.py'], True)
    """
    import grpc_tools
    from grpc_tools import protoc

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO_DIR / PROTO_NAME),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"grpc_tools.protoc failed with exit code {code}")

    grpc_path = out_dir / "fedfilter_pb2_grpc.py"
    text = grpc_path.read_text(encoding="utf-8")
    if text.count(_BARE_IMPORT) != 1:
        raise RuntimeError(
            f"expected exactly one line {_BARE_IMPORT.strip()!r} in {grpc_path}; "
            "the grpcio-tools output format changed, update protos/generate.py"
        )
    grpc_path.write_text(text.replace(_BARE_IMPORT, _PACKAGE_IMPORT), encoding="utf-8")
    return [out_dir / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    """The command line: ``generate`` into ``--out`` (default in place), printing each path written.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status, 0.

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()) as out:
    ...     status = main(["--out", tmp])
    >>> status, len(out.getvalue().splitlines())
    (0, 3)
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_DIR, help="output directory")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
