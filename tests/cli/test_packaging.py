"""The wheel installs one import root, fedfilter, holding the folders that package-dir maps into it.

The repository keeps client/, coordinator/, protos/ and simulations/ beside fedfilter/ on disk; an
editable install hides a wrong mapping (its finder reads the source tree), so these tests build a real
wheel, read its file list, and install it into a throwaway venv that reuses this interpreter's
dependencies but not its editable fedfilter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Folder on disk -> package it installs as (pyproject's [tool.setuptools.package-dir]).
MAPPED = {
    "fedfilter": "fedfilter",
    "client": "fedfilter/client",
    "coordinator": "fedfilter/coordinator",
    "privacy": "fedfilter/privacy",
    "protocol": "fedfilter/protocol",
    "protos": "fedfilter/protos",
    "simulations": "fedfilter/simulations",
}
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", "logs", "results")
# Not marked slow: building and installing the wheel takes about 8 s here.


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources, so no stale build/ of the work tree leaks into it."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    for folder in MAPPED:
        shutil.copytree(REPO / folder, src / folder, ignore=SKIP)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), "."], src)
    wheels = list(out.glob("fedfilter-*.whl"))
    assert len(wheels) == 1, f"expected one fedfilter wheel. Found {wheels}."
    return wheels[0]


def _package_modules(folder: str) -> set[str]:
    """Every .py file of the folder's packages (directories with an __init__.py all the way up), as
    wheel paths: a package folder missing from pyproject's list shows up as missing files."""
    root, target = REPO / folder, MAPPED[folder]
    found = set()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts:
            continue
        dirs = [root.joinpath(*rel.parts[:i]) for i in range(len(rel.parts))]
        if all((d / "__init__.py").is_file() for d in dirs):
            found.add(f"{target}/{rel.as_posix()}")
    return found


def test_the_wheel_holds_one_import_root_with_every_mapped_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = [t for t in tops if t.endswith(".dist-info")]
    assert tops - set(dist_info) == {"fedfilter"}, f"top-level entries besides .dist-info: {sorted(tops)}"
    assert len(dist_info) == 1, f"expected one .dist-info. Found {dist_info}."

    listed = set(names)
    for folder in MAPPED:
        missing = _package_modules(folder) - listed
        assert not missing, f"{folder}/ modules missing from the wheel: {sorted(missing)}"
    assert "fedfilter/client/filter_mod.py" in listed  # the rglob above found something to check
    data = {
        "fedfilter/app/pyproject.toml",
        *(f"fedfilter/protos/{p.name}" for p in (REPO / "protos").glob("*.proto")),
        *(f"fedfilter/simulations/configs/{p.name}" for p in (REPO / "simulations/configs").glob("*.toml")),
    }
    assert any(d.endswith(".proto") for d in data) and any(d.endswith(".toml") and "configs" in d for d in data)
    assert not data - listed, f"package data missing from the wheel: {sorted(data - listed)}"
    # Nothing of the source folders leaks in under its own name (it would import as `client`, ...).
    assert not [
        n
        for n in names
        if n.split("/", 1)[0] in {"client", "coordinator", "privacy", "protocol", "protos", "simulations"}
    ]

    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info[0]}/entry_points.txt").decode()
    scripts = entry_points.split("[console_scripts]", 1)[1].split("[", 1)[0]
    assert "fedfilter = fedfilter.cli:main" in [line.strip() for line in scripts.splitlines()], entry_points


def test_this_test_maps_the_folders_pyproject_maps() -> None:
    # MAPPED drives every check here: a folder added to package-dir must be checked too.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir = pyproject["tool"]["setuptools"]["package-dir"]
    assert {folder: package.replace(".", "/") for package, folder in package_dir.items()} == MAPPED


# Study and app libraries: a device or a coordinator installs `fedfilter` without them (pyproject's extras).
HEAVY = {"torch", "h5py", "matplotlib", "scikit-learn", "tqdm", "ray"}


def _requirement_name(line: str) -> str:
    spec = line.split(":", 1)[1].split(";", 1)[0].strip()
    for stop in "[<>=!~ (":
        spec = spec.split(stop, 1)[0]
    return spec.lower()


def test_core_requirements_are_light(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    lines = archive.read(metadata).decode().splitlines()
    requires = [line for line in lines if line.startswith("Requires-Dist:")]
    core = [line for line in requires if "extra ==" not in line]
    assert {_requirement_name(line) for line in core} >= {"flwr", "numpy", "cryptography"}, core
    heavy = [line for line in core if _requirement_name(line) in HEAVY or "flwr[simulation]" in line]
    assert not heavy, f"core requirements name app or study libraries: {heavy}"
    extras = {line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra:")}
    assert {"app", "study", "dev"} <= extras, extras
    app = {_requirement_name(line) for line in requires if 'extra == "app"' in line}
    assert {"torch", "scikit-learn", "matplotlib", "tqdm"} <= app, requires


def test_the_installed_wheel_imports_only_as_fedfilter(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    py = bin_dir / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
    site_dir = Path(purelib.stdout.strip())
    # Reuse this interpreter's dependencies (pip included): its site directories as plain .pth lines,
    # which Python appends to sys.path without running the .pth files inside them (so this
    # environment's editable fedfilter finder stays out).
    deps = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    assert deps, f"no site-packages on this interpreter's sys.path: {sys.path}"
    (site_dir / "zz_reuse_deps.pth").write_text("\n".join(deps) + "\n")
    # --force-reinstall: this interpreter's fedfilter (same version) is visible through the .pth.
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], tmp_path)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # cwd is an empty folder: the repository's client/ must not be importable from there.
    bare = subprocess.run([str(py), "-c", "import client"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr, bare.stderr
    code = "import fedfilter, fedfilter.client.filter_mod as m; print(fedfilter.__file__); print(m.__file__)"
    where = _run([str(py), "-c", code], tmp_path, env)
    for line in where.stdout.split():
        assert Path(line).resolve().is_relative_to(site_dir.resolve()), f"imported from outside the wheel: {line}"
    assert "usage: fedfilter" in _run([str(bin_dir / "fedfilter"), "--help"], tmp_path, env).stdout
    # A pip user finds the packaged studies by name, and the help names where they are installed.
    dry = _run([str(bin_dir / "fedfilter"), "study", "dropout", "--config", "smoke", "--dry-run"], tmp_path, env)
    config = Path(dry.stdout.split(":", 1)[0])
    assert config.name == "smoke.toml" and config.resolve().is_relative_to(site_dir.resolve()), dry.stdout
    helped = _run([str(bin_dir / "fedfilter"), "study", "dropout", "--help"], tmp_path, env).stdout
    assert "smoke" in helped and str(site_dir.resolve()) in " ".join(helped.split()).replace("- ", "-")
