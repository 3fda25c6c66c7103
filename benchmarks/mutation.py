"""Mutation testing of the privacy code: which small wrong changes does the test suite let through?

    python benchmarks/mutation.py                          # every target file, default budget
    python benchmarks/mutation.py --files privacy/filters.py --max-minutes 20
    python benchmarks/mutation.py --list                   # only count the mutants
    python benchmarks/mutation.py --rerun docs/mutation_survivors.txt --tests tests/test_new.py
                                                           # survivors again, after adding tests

A small AST mutator (no mutmut / cosmic-ray: both need the package importable from their own
copy of the tree, and this venv's editable install points at another checkout; a mutator of our
own also knows the operators that matter here, such as the direction of ``nextafter``). It:

1. copies the checkout (tracked and untracked, not ignored files) to a temporary directory;
2. times every test of the test files mapped to each target (``TESTS``) on the unmutated copy and
   keeps the fast ones (``--max-test-seconds``), fastest first: the subset a mutant must survive;
3. applies one mutant at a time (the file is rewritten with ``ast.unparse``; an unmutated unparse
   is checked to pass first) and runs the subset in a forked child of a process that already
   imported numpy, mpmath, dp_accounting and flwr (``pytest -x``, killed after ``--timeout``);
4. writes every surviving mutant (file, line, mutation, source line) to ``--out`` and prints a
   summary per file. Mutants that did not fit into ``--max-minutes`` are counted as not run.

Operators: comparison boundaries and negations (``<``/``<=``, ``==``/``!=``, ``is``/``is not``,
``in``/``not in``), arithmetic swaps (``+``/``-``, ``*``/``/``, ``**`` to ``*``), ``and``/``or``,
dropped unary minus and ``not``, numeric constants (+1, -1 for integers; x1.1 and +1 for floats),
``True``/``False``, directed rounding swapped or dropped (``up``/``down``, ``add_up`` -> ``np.add``
...), the direction of ``nextafter``, ``min``/``max`` and ``any``/``all`` swaps, a call replaced by
its argument, and removed statements (a call statement, ``raise``, ``assert``, augmented assign).
They live in ``benchmarks/mutation_ops.py``; this script copies, times and runs.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the operators' module beside this script, however run
from mutation_ops import Mutant, apply_mutant, find_mutants, survivor_key  # noqa: E402

_PRIVACY_TESTS = [
    "tests/client/ledger/test_budget_references.py",
    "tests/privacy/test_renyi_zcdp.py",
    "tests/privacy/test_gaussian_dp.py",
    "tests/privacy/test_filters_shared.py",
]
# Test files that exercise each target; the fast tests among them are chosen by timing.
TESTS: dict[str, list[str]] = {
    "fedfilter/privacy/filters.py": _PRIVACY_TESTS
    + ["tests/client/test_release.py", "tests/client/ledger/test_ledger.py"],
    "fedfilter/privacy/rounding.py": _PRIVACY_TESTS,
    "fedfilter/privacy/gaussian_dp.py": _PRIVACY_TESTS,
    "fedfilter/privacy/zcdp.py": _PRIVACY_TESTS,
    "fedfilter/privacy/renyi.py": _PRIVACY_TESTS,
    "fedfilter/privacy/pure_dp.py": ["tests/privacy/test_pure_dp_baselines.py"],
    "planning/rounds.py": ["tests/cli/test_cli_planner.py"],
    "fedfilter/client/ledger/budget.py": [
        "tests/client/ledger/test_ledger.py",
        "tests/client/test_mod_replay.py",
        "tests/client/ledger/test_budget_references.py",
        "tests/client/test_release.py",
    ],
    "fedfilter/client/release.py": [
        "tests/client/test_release.py",
        "tests/client/ledger/test_budget_references.py",
        "tests/client/test_mod_replay.py",
    ],
    "fedfilter/client/mechanisms/gaussian.py": [
        "tests/client/test_release.py",
        "tests/client/ledger/test_budget_references.py",
        "tests/client/mechanisms/test_noise.py",
    ],
    "fedfilter/client/mechanisms/gaussian_noise.py": ["tests/client/mechanisms/test_noise.py"],
    "fedfilter/client/ledger/seal.py": ["tests/client/ledger/test_ledger_fail_closed.py"],
}
TESTS["privacy/filters.py"] += [
    "tests/privacy/test_allowance_constant_work.py",
    "tests/privacy/test_rdp_filter.py",
]
TESTS["privacy/renyi.py"] += ["tests/privacy/test_rdp_filter.py"]
TESTS["client/ledger/budget.py"] += [
    "tests/client/ledger/test_ledger_fail_closed.py",
    "tests/client/ledger/test_quota.py",
]
TESTS["client/release.py"] += [
    "tests/client/test_request_bounds.py",
    "tests/client/mechanisms/test_noise.py",
    "tests/client/ledger/test_quota.py",
]
# Default targets, most privacy-critical first (a time budget runs them in this order).
DEFAULT_FILES = [
    "fedfilter/privacy/filters.py",
    "fedfilter/privacy/rounding.py",
    "fedfilter/privacy/zcdp.py",
    "fedfilter/privacy/renyi.py",
    "fedfilter/client/ledger/budget.py",
    "fedfilter/privacy/gaussian_dp.py",
    "fedfilter/client/release.py",
    "fedfilter/client/mechanisms/gaussian.py",
    "fedfilter/client/mechanisms/gaussian_noise.py",
    "fedfilter/client/ledger/seal.py",
]
# Imported once in the parent so that each forked child starts warm. Never the project's own code.
PRELOAD = ["numpy", "scipy.stats", "mpmath", "dp_accounting", "hypothesis", "pytest", "flwr.app", "sqlite3"]


# --- running tests in forked, pre-warmed children ---------------------------------------------
def _run_pytest(workdir: Path, args: list[str], timeout: float) -> tuple[str, float]:
    """Run pytest in a forked child inside ``workdir``; ('pass'|'fail'|'error'|'timeout', seconds)."""
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child: its own process group, so a timeout can stop whatever it spawned
        code = 3
        try:
            os.setpgid(0, 0)
            os.chdir(workdir)
            sys.path.insert(0, str(workdir))
            os.environ["PYTHONPATH"] = str(workdir)  # for tests that spawn interpreters
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--no-header", *args]))
        finally:
            os._exit(code)
    deadline = started + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        if time.perf_counter() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout", time.perf_counter() - started
        time.sleep(0.02)
    verdict = {0: "pass", 1: "fail"}.get(code, "error")
    return verdict, time.perf_counter() - started


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\n")
    for rel in files:
        src = ROOT / rel
        if rel and src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _fast_tests(workdir: Path, files: list[str], max_seconds: float, timeout: float) -> list[str]:
    """Node ids of the tests in ``files`` that pass and take at most ``max_seconds``, fastest first."""
    report = workdir / ".mutation-timing.xml"
    verdict, _ = _run_pytest(workdir, ["--junitxml", str(report), *files], timeout * 10)
    if verdict != "pass":
        raise SystemExit(f"the unmutated tests do not pass ({verdict}): {files}")
    timed = []
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        module = case.get("classname", "").replace(".", "/") + ".py"
        timed.append((float(case.get("time", 0)), f"{module}::{case.get('name')}"))
    return [node for t, node in sorted(timed) if t <= max_seconds]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="+", default=DEFAULT_FILES, help="target files, in order")
    ap.add_argument("--max-minutes", type=float, default=60.0, help="stop starting mutants after this")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per mutant before it counts as killed")
    ap.add_argument("--max-test-seconds", type=float, default=1.0, help="slower tests are left out of the subset")
    ap.add_argument("--out", default="docs/mutation_survivors.txt", help="where the survivors are written")
    ap.add_argument("--list", action="store_true", help="only count the mutants per file")
    ap.add_argument(
        "--tests",
        nargs="+",
        help="test files for every target instead of TESTS (e.g. only the "
        "new ones when rerunning survivors: those already passed everything else)",
    )
    ap.add_argument(
        "--rerun",
        metavar="SURVIVORS",
        help="only the mutants listed in this survivors file (e.g. after adding tests); its files replace --files",
    )
    args = ap.parse_args(argv)

    if args.rerun:
        listed = [ln.rstrip("\n") for ln in Path(args.rerun).read_text().splitlines() if ln and not ln.startswith("#")]
        args.files = list(dict.fromkeys(ln.split(":", 1)[0] for ln in listed))
        wanted = set(listed)
    mutants = {f: find_mutants(f, (ROOT / f).read_text()) for f in args.files}
    if args.rerun:
        mutants = {f: [m for m in ms if survivor_key(m) in wanted] for f, ms in mutants.items()}
        found = {survivor_key(m) for ms in mutants.values() for m in ms}
        missing = len(wanted - found)
        if missing:
            print(f"{missing} listed mutants no longer exist in the code (changed lines); not rerun")
    if args.list:
        for f, ms in mutants.items():
            print(f"{f}: {len(ms)} mutants")
        print(f"total: {sum(map(len, mutants.values()))}")
        return 0

    for mod in PRELOAD:
        __import__(mod)
    t0 = time.perf_counter()
    results: dict[str, dict[str, int]] = {}
    survivors: list[Mutant] = []
    with tempfile.TemporaryDirectory(prefix="fedfilter-mutation-") as tmp:
        work = Path(tmp)
        _copy_tree(work)
        subsets: dict[tuple, list[str]] = {}
        for f in args.files:
            counts = results.setdefault(f, {"killed": 0, "survived": 0, "timeout": 0, "not run": 0})
            test_files = tuple(args.tests or TESTS.get(f, _PRIVACY_TESTS))
            original = (ROOT / f).read_text()
            target = work / f
            # The unparsed (but unmutated) file must pass: mutants are written the same way.
            target.write_text(ast.unparse(ast.parse(original)))
            if test_files not in subsets:
                subsets[test_files] = _fast_tests(work, list(test_files), args.max_test_seconds, args.timeout)
                print(f"[{f}] test subset: {len(subsets[test_files])} tests from {', '.join(test_files)}", flush=True)
            subset = subsets[test_files]
            verdict, secs = _run_pytest(work, subset, args.timeout * 3)
            if verdict != "pass":
                raise SystemExit(f"{f}: the unparsed file fails its tests ({verdict})")
            for n, m in enumerate(mutants[f]):
                if n and n % 25 == 0:
                    print(f"  [{f}] {n}/{len(mutants[f])} mutants ({time.perf_counter() - t0:.0f} s)", flush=True)
                if time.perf_counter() - t0 > args.max_minutes * 60:
                    counts["not run"] += 1
                    continue
                mutated = apply_mutant(original, m)
                if mutated == ast.unparse(ast.parse(original)):
                    continue
                target.write_text(mutated)
                verdict, secs = _run_pytest(work, subset, args.timeout)
                if verdict == "pass":
                    counts["survived"] += 1
                    survivors.append(m)
                    print(f"  SURVIVED {m.path}:{m.line}: {m.description}", flush=True)
                else:
                    counts["timeout" if verdict == "timeout" else "killed"] += 1
            target.write_text(original)
            c = counts
            print(
                f"[{f}] killed {c['killed']}, timeout {c['timeout']}, survived {c['survived']}, "
                f"not run {c['not run']}  ({time.perf_counter() - t0:.0f} s so far)",
                flush=True,
            )

    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        how = f"--rerun {args.rerun}" if args.rerun else f"--files {' '.join(args.files)}"
        fh.write(f"# surviving mutants: python benchmarks/mutation.py {how} --max-minutes {args.max_minutes:g}\n")
        for f, c in results.items():
            fh.write(
                f"# {f}: killed {c['killed']}, timed out {c['timeout']}, survived {c['survived']}, "
                f"not run {c['not run']}\n"
            )
        for m in survivors:
            fh.write(survivor_key(m) + "\n")
    total = {k: sum(c[k] for c in results.values()) for k in ("killed", "timeout", "survived", "not run")}
    run = total["killed"] + total["timeout"] + total["survived"]
    print(
        f"\n{run} mutants run in {time.perf_counter() - t0:.0f} s: {total['killed']} killed, "
        f"{total['timeout']} timed out, {total['survived']} survived, {total['not run']} not run; "
        f"survivors in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
