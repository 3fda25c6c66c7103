"""What the malicious-server checks cost per secure round, next to Flower's plain SecAgg+.

    python benchmarks/secagg_consistency_cost.py [--clients 10 20 30] [--rounds 5] [--dim 10000]

Both variants run Flower's own SecAgg+ protocol code on the same in-process loopback
(``tests/harness/secagg_loopback.py``: every message through Flower's wire format to an in-process ClientApp,
one node after the other, so a round's time is the whole federation's compute), with fedfilter's
ChaCha20 mask generator, the distributed integer grid (``secaggplus_settings``, ``encode_report``),
every sampled node a neighbour (``num_shares = 1.0``) and the same threshold (more than half the
nodes, as the devices now require):

* plain: ``SecAggPlusWorkflow`` with ``secaggplus_mod`` on the clients (Flower's semi-honest protocol);
* checked: ``ConsistencyCheckedSecAggPlus`` with ``secure_aggregation_mod`` (the collect-stage checks,
  the consistency round's survivor-set MACs, the unmask checks; ``client/secagg/consistency.py``).

The clients' inner handler returns a fixed integer report of ``--dim`` coordinates (no training, no
noise, no ledger): the difference is the protocol's. Printed, as medians over the timed rounds
(alternating, after one untimed round of each): the CPU seconds per secure round of each variant
(this process runs every device and the server, so it is the federation's compute; CPU time, as the
machine is shared), the CPU seconds spent inside the devices' added steps (the collect-stage checks,
the MACs on the survivor set, the unmask checks; all devices together), the consistency round's
wall time, and the bytes on the wire per round (every message both ways, serialized).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/harness: drivers not shipped


def run(n: int, rounds: int, dim: int) -> dict:
    import numpy as np
    from flwr.app import Context, Message, RecordDict
    from flwr.client.mod import secaggplus_mod
    from flwr.clientapp import ClientApp
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE
    from flwr.common.serde import message_to_proto
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from harness.secagg_loopback import LoopbackGrid

    import fedfilter.client.secagg.mod as device
    from fedfilter.client.secagg.mod import secure_aggregation_mod
    from fedfilter.coordinator.secagg.consistency import ConsistencyCheckedSecAggPlus
    from fedfilter.coordinator.secagg.secure_round import round_graph
    from fedfilter.protocol.secagg.grid import encode_report, secaggplus_settings
    from fedfilter.protocol.secagg.masks import cryptographic_masks, use_cryptographic_masks

    settings = secaggplus_settings(n)
    threshold = round_graph(n, 2, 1.0).threshold  # the full graph, as this benchmark runs it
    rng = np.random.default_rng(0)
    reports = {100 + i: [rng.integers(-500, 500, dim)] for i in range(n)}

    def inner(msg: Message, ctx: Context) -> Message:
        q = int(ctx.state.config_records[RECORD_KEY_STATE]["target_range"])
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(encode_report(reports[ctx.node_id], q)), 1, {})
        return Message(compat.fitres_to_recorddict(fitres, True), reply_to=msg)

    def install(msg, ctx, call_next):
        use_cryptographic_masks()
        return call_next(msg, ctx)

    def apps(mods):
        out = {}
        for nid in reports:
            app = ClientApp(mods=mods)
            app.train()(inner)
            out[nid] = app
        return out

    variants = {
        "plain": (SecAggPlusWorkflow, apps([install, secaggplus_mod])),
        "checked": (ConsistencyCheckedSecAggPlus, apps([secure_aggregation_mod])),
    }
    # CPU seconds inside the device's added steps (all devices of the round together).
    added = [0.0]
    for name in ("_collect_problems", "_seal_certificate", "_consistency_reply", "_unmask_problems"):
        original = getattr(device, name)

        def timed(*a, _f=original, **kw):
            start = time.process_time()
            try:
                return _f(*a, **kw)
            finally:
                added[0] += time.process_time() - start

        setattr(device, name, timed)
    added_per_round: list[float] = []
    times: dict[str, list[float]] = {k: [] for k in variants}
    wire: dict[str, list[int]] = {k: [] for k in variants}
    consistency_s: list[float] = []

    class Timed(ConsistencyCheckedSecAggPlus):
        def consistency_stage(self, grid, context, state):
            start = time.perf_counter()
            super().consistency_stage(grid, context, state)
            consistency_s.append(time.perf_counter() - start)

    for r in range(rounds + 1):
        for name, (workflow_class, node_apps) in variants.items():
            grid = LoopbackGrid(dict(node_apps))
            sizes = [0]
            send = grid.send_and_receive

            def counted(messages, *, timeout=None, _send=send, _sizes=sizes):
                messages = list(messages)
                replies = _send(messages, timeout=timeout)
                _sizes[0] += sum(message_to_proto(m).ByteSize() for m in messages + list(replies))
                return replies

            grid.send_and_receive = counted
            strategy = FedAvg(
                fraction_fit=1.0,
                fraction_evaluate=0.0,
                min_fit_clients=n,
                min_available_clients=n,
                initial_parameters=ndarrays_to_parameters([np.zeros(dim)]),
            )
            ctx = LegacyContext(
                Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config={}),
                config=ServerConfig(num_rounds=1),
                strategy=strategy,
            )
            cls = Timed if workflow_class is ConsistencyCheckedSecAggPlus else workflow_class
            workflow = cls(num_shares=1.0, reconstruction_threshold=threshold, **settings)
            added[0] = 0.0
            start = time.process_time()
            with cryptographic_masks():
                DefaultWorkflow(fit_workflow=workflow)(grid, ctx)
            elapsed = time.process_time() - start
            unmasked = [m for m in grid.received if "secaggplus_configs" in m.content.config_records]
            if not unmasked:
                raise RuntimeError(f"{name}: the round did not complete")
            if r:  # the first round of each is untimed
                times[name].append(elapsed)
                wire[name].append(sizes[0])
                if name == "checked":
                    added_per_round.append(added[0])
    plain, checked = statistics.median(times["plain"]), statistics.median(times["checked"])
    return {
        "clients": n,
        "threshold": threshold,
        "plain_s": plain,
        "checked_s": checked,
        "consistency_s": statistics.median(consistency_s[1:]),
        "device_checks_s": statistics.median(added_per_round),
        "plain_bytes": statistics.median(wire["plain"]),
        "checked_bytes": statistics.median(wire["checked"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dim", type=int, default=10000)
    args = parser.parse_args(argv)
    print(
        "| clients | threshold | plain SecAgg+ CPU s/round | with the checks CPU s/round "
        "| in the devices' added steps CPU s/round | consistency round s | wire kB/round plain / checked (added) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.clients:
        row = run(n, args.rounds, args.dim)
        kb_plain, kb_checked = row["plain_bytes"] / 1e3, row["checked_bytes"] / 1e3
        share = 100 * row["device_checks_s"] / row["checked_s"]
        print(
            f"| {n} | {row['threshold']} | {row['plain_s']:.3f} | {row['checked_s']:.3f} | "
            f"{row['device_checks_s']:.3f} ({share:.1f}%) | {row['consistency_s']:.3f} | "
            f"{kb_plain:.0f} / {kb_checked:.0f} ({kb_checked - kb_plain:+.0f}) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
