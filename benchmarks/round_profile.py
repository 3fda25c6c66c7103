"""Where one round's time goes, by cProfile: own time per function, grouped by where the code lives.

Used by ``benchmarks/secagg_overhead.py --profile FILE``. cProfile slows Python-heavy code
most, so read the groups' shares, not their seconds.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

# Where a function's own time is charged in --profile's split: the first fragment that matches its file
# path (Python) or its name (a C function or method), else "other Python" / "other C (builtins)".
_PROFILE_GROUPS = (
    ("flwr/app/message", "Flower records (RecordDict, ConfigRecord, Message)"),
    ("flwr/common/serde", "Flower serde (records <-> protobuf)"),
    ("secaggplus_mod", "Flower secaggplus_mod"),
    ("flwr/server/workflow", "Flower server workflow"),
    ("flwr/common/secure_aggregation", "Flower SecAgg+ utils"),
    ("flwr/", "Flower, other"),
    ("_collections_abc", "typing/abc machinery"),
    ("<frozen abc>", "typing/abc machinery"),
    ("typing.py", "typing/abc machinery"),
    ("logging", "logging"),
    ("cryptography", "cryptography (Python part)"),
    ("torch", "torch"),
    ("numpy", "numpy"),
    ("/protocol/", "fedfilter protocol/ (primitives)"),
    ("/client/", "fedfilter client/ (device mod, consistency)"),
    ("/coordinator/", "fedfilter coordinator/"),
    ("/simulations/", "loopback harness"),
)
_PROFILE_C_GROUPS = (
    ("ed25519", "Ed25519 (C)"),
    ("x25519", "X25519 (C)"),
    ("hkdf", "HKDF (C)"),
    ("ciphers", "AES, HMAC (C)"),
    ("hmac", "AES, HMAC (C)"),
    ("_abc", "typing/abc machinery"),
    ("isinstance", "isinstance (C)"),
    ("torch", "torch"),
    ("ufunc", "numpy"),
    ("numpy", "numpy"),
    ("protobuf", "protobuf (C)"),
    ("Serialize", "protobuf (C)"),
    ("Parse", "protobuf (C)"),
)


def profile_split(stats) -> dict[str, float]:
    """``pstats.Stats`` -> own seconds per group of ``_PROFILE_GROUPS``, largest first."""
    groups: dict[str, float] = defaultdict(float)
    for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():
        rules, where, other = (
            (_PROFILE_C_GROUPS, name, "other C (builtins)")
            if filename == "~"
            else (_PROFILE_GROUPS, filename, "other Python")
        )
        groups[next((g for fragment, g in rules if fragment in where), other)] += tottime
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def profiled_round(run_round, path: Path) -> None:
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(run_round)
    profiler.dump_stats(path)
    stats = pstats.Stats(profiler)
    total = sum(t for _, _, t, _, _ in stats.stats.values())
    print(f"# --profile: one secure round under cProfile, {total:.3f} s of own time (profiler included); {path}")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
    print("\n".join("#   " + line for line in text.getvalue().splitlines() if line.strip()))
    for group, seconds in profile_split(stats).items():
        print(f"#   {seconds:7.3f} s {100 * seconds / total:5.1f}%  {group}")
