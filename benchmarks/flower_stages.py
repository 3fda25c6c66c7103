"""Where the filtered path's time goes, per client and round: ``individual_filter_mod`` called in
one process (no Ray, no Flower engine) around a trivial train handler, on a real model's arrays.

    python benchmarks/flower_stages.py [--task digits|mnist] [--rounds 300] [--ledger-root DIR]

Each stage is timed by wrapping the function that does it where the mod looks it up (wall time,
``perf_counter``); the mod's CPU time (``process_time``) is measured over the whole loop, without
the wrappers. ``--ledger-root /dev/shm`` puts the ledger (and its roll-back anchor) on tmpfs, where
an fsync costs nothing: what remains is the CPU work around the durable commit. The handler adds 0.001 to every weight
(it stands for training, which is not measured here: ``flower_overhead.py`` measures whole rounds).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import tempfile
import time
from pathlib import Path

# (module, function, stage): the stage each wrapped call is charged to, wrapped where the mod
# looks the function up ("fedfilter.client.<module>" or "fedfilter.client.<module>.<Class>");
# nested stages are subtracted from their parent when the table is printed. A stage whose function
# is gone, or is no longer called there, stops the run: the table must follow the code.
STAGES = [
    ("round.admit", "device_config", "settings (node_config -> DeviceConfig)"),
    ("round.admit", "round_spec_from_record", "request parsing and checks"),
    ("round.placement", "check_request", "request parsing and checks"),
    ("round.admit", "decode", "read Arrays (model received, model returned)"),
    ("round.train", "decode", "read Arrays (model received, model returned)"),
    ("round.run", "cached_ledger", "ledger open (per-process cache)"),
    ("round.run", "_filtered", "(filtered round)"),
    ("ledger.budget.BudgetLedger", "has_release", "replay pre-check (one SELECT)"),
    ("round.train", "_inner_update", "(inner handler + update)"),
    ("round.release", "release", "(release)"),
    ("ledger.budget.BudgetLedger", "_check_seal", "seal check (read seal, SELECT its row)"),
    ("ledger.budget.BudgetLedger", "_check_anchor", "roll-back anchor check (read anchor, SELECT its row)"),
    ("ledger.quota.Reservation", "allowance", "allowance (every cap)"),
    ("mechanisms.gaussian", "clip_to_norm", "clipping (certified norm x2)"),
    ("mechanisms.gaussian", "snap_toward_zero", "snapping to the noise grid"),
    ("ledger.quota.Reservation", "commit", "record the spend (INSERT)"),
    ("ledger.budget.BudgetLedger", "_seal_latest", "seal write (fsync file + rename + fsync dir)"),
    ("ledger.budget", "advance_anchor", "roll-back anchor write (flock, re-check, pwrite + fdatasync)"),
    ("mechanisms.gaussian", "add_grid_noise", "noise (ChaCha20 + exact rounded Gaussian)"),
    ("round.placement.LocalPlacement", "reply", "reply building (encode Arrays)"),
]


def _lookup(module_path: str) -> object:
    """The module or class ``module_path`` names under ``fedfilter.client``."""
    import importlib

    parts = module_path.split(".")
    owner = parts.pop() if parts[-1][:1].isupper() else None
    module = importlib.import_module("fedfilter.client." + ".".join(parts))
    if owner is None:
        return module
    if not hasattr(module, owner):
        raise SystemExit(f"STAGES: fedfilter.client.{module_path} does not exist; update the table")
    return getattr(module, owner)


def _install_timers(totals: collections.Counter, calls: collections.Counter) -> None:
    for module_path, name, stage in STAGES:
        target = _lookup(module_path)
        if not hasattr(target, name):
            raise SystemExit(f"STAGES: fedfilter.client.{module_path} has no {name!r}; update the table")
        original = getattr(target, name)

        def timed(*args, __f=original, __key=(module_path, name), __stage=stage, **kwargs):
            started = time.perf_counter()
            try:
                return __f(*args, **kwargs)
            finally:
                totals[__stage] += time.perf_counter() - started
                calls[__key] += 1

        setattr(target, name, functools.wraps(original)(timed))


def _check_every_stage_ran(calls: collections.Counter) -> None:
    """A wrapped function the round no longer calls there would time nothing, silently."""
    idle = [f"fedfilter.client.{m}.{n}" for m, n, _ in STAGES if calls[(m, n)] == 0]
    if idle:
        raise SystemExit(f"STAGES: never called during the timed rounds: {', '.join(idle)}; update the table")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("digits", "mnist"), default="mnist")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--ledger-root", default=None, help="where the device's ledger lives (default: $TMPDIR)")
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as in a Ray actor (OMP_NUM_THREADS=1)

    with tempfile.TemporaryDirectory(prefix="fedfilter-stages-", dir=args.ledger_root) as tmp:
        # The roll-back anchor beside the ledger (same disk), not in the user's state directory.
        os.environ["FEDFILTER_STATE_DIR"] = str(Path(tmp) / "owner-state")
        measure(args, Path(tmp))


def measure(args, tmp: Path) -> None:
    import numpy as np
    import torch
    from flwr.app import Array, ArrayRecord, Context, Message, Metadata, RecordDict

    import fedfilter.client.filter_mod as flower_mod
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.protocol.request import RoundSpec
    from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_record
    from fedfilter.simulations.tasks.models import DigitsMLP, MnistCNN

    torch.manual_seed(0)
    model = {"digits": DigitsMLP, "mnist": MnistCNN}[args.task]()
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    config = {"ledger-dir": str(tmp / "ledger"), "client-id": "c", "budget-epsilon": 1000.0, "reply-hold-s": 0}
    enrol_device(config)
    context = Context(run_id=7, node_id=42, node_config=config, state=RecordDict(), run_config={})
    handler_s = [0.0]

    def handler(msg: Message, ctx: Context) -> Message:
        started = time.perf_counter()
        record = next(iter(msg.content.array_records.values()))
        new = {k: Array((record[k].numpy() + 0.001).astype(np.float32)) for k in record.keys()}
        out = Message(RecordDict({"arrays": ArrayRecord(new)}), reply_to=msg)
        handler_s[0] += time.perf_counter() - started
        return out

    def message(round_id: int) -> Message:
        content = RecordDict({ARRAYS_RECORD: ArrayRecord({k: Array(v) for k, v in weights.items()})})
        content[REQUEST_RECORD] = request_record(RoundSpec("stages", round_id, 1.0, 0.5))
        meta = Metadata(
            run_id=7,
            message_id=f"m{round_id}",
            src_node_id=1,
            dst_node_id=42,
            reply_to_message_id="",
            group_id=str(round_id),
            created_at=time.time(),
            ttl=3600.0,
            message_type="train.filtered",
        )
        return Message(content=content, metadata=meta)

    def run(first: int, n: int) -> float:
        messages = [message(r) for r in range(first, first + n)]
        started = time.perf_counter()
        for msg in messages:
            reply = flower_mod.individual_filter_mod(msg, context, handler)
            if reply.has_error():
                raise RuntimeError(reply.error.reason)
        return time.perf_counter() - started

    run(1, 5)  # opens and caches the ledger
    handler_s[0] = 0.0
    cpu = time.process_time()
    run(10, args.rounds)
    cpu = time.process_time() - cpu
    handler_cpu = time.process_time()
    for r in range(args.rounds):
        handler(message(10**6 + r), context)
    handler_cpu = time.process_time() - handler_cpu

    totals: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    _install_timers(totals, calls)
    handler_s[0] = 0.0
    wall = run(10 + args.rounds, args.rounds)
    _check_every_stage_ran(calls)
    per = {k: 1000 * v / args.rounds for k, v in totals.items()}
    handler_ms = 1000 * handler_s[0] / args.rounds
    # Nested stages: report each parent's own remainder.
    inner = per.pop("(inner handler + update)") - handler_ms
    per["update (returned - received, checks)"] = inner - per.get("read Arrays (model received, model returned)", 0) / 2
    release = per.pop("(release)")
    anchor_write = "roll-back anchor write (flock, re-check, pwrite + fdatasync)"
    per["seal write (fsync file + rename + fsync dir)"] -= per.get(anchor_write, 0)  # the anchor is inside it
    inside = [
        "seal check (read seal, SELECT its row)",
        "roll-back anchor check (read anchor, SELECT its row)",
        anchor_write,
        "allowance (every cap)",
        "clipping (certified norm x2)",
        "snapping to the noise grid",
        "record the spend (INSERT)",
        "seal write (fsync file + rename + fsync dir)",
        "noise (ChaCha20 + exact rounded Gaussian)",
    ]
    per["transaction (BEGIN IMMEDIATE, state reads, COMMIT + fsync)"] = release - sum(per.get(k, 0) for k in inside)
    filtered = per.pop("(filtered round)")
    per["rest of the filtered round"] = (
        filtered
        - release
        - inner
        - handler_ms
        - per.get("replay pre-check (one SELECT)", 0)
        - per.get("read Arrays (model received, model returned)", 0) / 2
    )
    mod_ms = 1000 * wall / args.rounds - handler_ms
    print(
        f"{args.task}: {args.rounds} rounds, ledger in {tmp}; mod wall time {mod_ms:.2f} ms per client-round "
        f"(handler excluded), mod CPU time {1000 * (cpu - handler_cpu) / args.rounds:.2f} ms"
    )
    print(f"{'stage':<62} {'ms':>7}")
    for stage, ms in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{stage:<62} {ms:>7.3f}")
    print(f"{'other (mod glue, Flower Message objects, timers)':<62} {mod_ms - sum(per.values()):>7.3f}")


if __name__ == "__main__":
    main()
