"""The wheel installs one import root, fedfilter, holding every package of fedfilter/ and nothing else.

An editable install hides a package missing from the wheel (it reads the source tree), so these tests
build a real wheel, read its file list, and install it into a throwaway venv that reuses this
interpreter's dependencies but not its editable fedfilter. The drivers only tests and benchmarks use
(tests/harness/) stay out of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The packages the design names, each a folder of fedfilter/ on disk and in the wheel.
FOLDERS = ("client", "coordinator", "privacy", "protocol", "protos", "simulations")
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
    shutil.copytree(REPO / "fedfilter", src / "fedfilter", ignore=SKIP)
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), "."], src)
    wheels = list(out.glob("fedfilter-*.whl"))
    assert len(wheels) == 1, f"expected one fedfilter wheel. Found {wheels}."
    return wheels[0]


def _package_modules() -> set[str]:
    """Every .py file of fedfilter's packages (directories with an __init__.py all the way up), as
    wheel paths: a package folder that packages.find would miss shows up as missing files."""
    root, target = REPO / "fedfilter", "fedfilter"
    found = set()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts:
            continue
        dirs = [root.joinpath(*rel.parts[:i]) for i in range(len(rel.parts))]
        if all((d / "__init__.py").is_file() for d in dirs):
            found.add(f"{target}/{rel.as_posix()}")
    return found


def test_the_wheel_holds_one_import_root_with_every_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = [t for t in tops if t.endswith(".dist-info")]
    assert tops - set(dist_info) == {"fedfilter"}, f"top-level entries besides .dist-info: {sorted(tops)}"
    assert len(dist_info) == 1, f"expected one .dist-info. Found {dist_info}."

    listed = set(names)
    missing = _package_modules() - listed
    assert not missing, f"fedfilter/ modules missing from the wheel: {sorted(missing)}"
    assert {f"fedfilter/{folder}/__init__.py" for folder in FOLDERS} <= listed
    assert "fedfilter/client/filter_mod.py" in listed  # the rglob above found something to check
    data = {
        "fedfilter/app/pyproject.toml",
        *(f"fedfilter/protos/{p.name}" for p in (REPO / "fedfilter/protos").glob("*.proto")),
        *(f"fedfilter/simulations/configs/{p.name}" for p in (REPO / "fedfilter/simulations/configs").glob("*.toml")),
    }
    assert any(d.endswith(".proto") for d in data) and any(d.endswith(".toml") and "configs" in d for d in data)
    assert not data - listed, f"package data missing from the wheel: {sorted(data - listed)}"
    # Test drivers (tests/harness/) do not ship, under any name.
    assert not [n for n in names if "harness" in n.split("/")], [n for n in names if "harness" in n]

    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info[0]}/entry_points.txt").decode()
    scripts = entry_points.split("[console_scripts]", 1)[1].split("[", 1)[0]
    assert "fedfilter = fedfilter.cli:main" in [line.strip() for line in scripts.splitlines()], entry_points


def test_every_package_folder_is_a_package() -> None:
    # packages.find picks up folders with an __init__.py: a folder of modules without one would be left
    # out of the wheel while the editable install still imports it.
    for d in (REPO / "fedfilter").rglob("*"):
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
            assert (d / "__init__.py").is_file(), f"{d.relative_to(REPO)} holds modules but no __init__.py"


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
