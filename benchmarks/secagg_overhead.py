"""Seconds per round with and without Flower's SecAgg+, same clients, same model, same run.

    python benchmarks/secagg_overhead.py [--clients 10 100 1000] [--rounds 3] [--warmup 1] [--num-shares auto]
        [--min-reports-fraction 0.5] [--workflow product|flower] [--profile FILE]

Where: in-process rounds through ``tests/harness/secagg_loopback.py``'s ``LoopbackGrid`` (every message goes
through Flower's wire format to an in-process ClientApp, one node after the other; no Ray, no
network), so a round's time is the whole federation's compute: every client's and the server's.
Flower's real protocol code runs on both sides: the legacy ``DefaultWorkflow`` fit round
(``default_fit_workflow``) for the plain rounds; for the secure rounds, by default
(``--workflow product``) what fedfilter runs: the coordinator's ``ConsistencyCheckedSecAggPlus``
(Flower's ``SecAggPlusWorkflow``: setup, share keys, collect masked vectors, unmask, plus the
consistency round before unmask) with ``secure_aggregation_mod`` on the clients (Flower's
``secaggplus_mod`` with the devices' key checks and survivor-set MACs);
``--workflow flower`` runs Flower's bare ``SecAggPlusWorkflow`` with ``secaggplus_mod``. Both with
fedfilter's SecAgg+ primitives installed (``fedfilter.protocol.secagg.masks``: AES-256-CTR masks,
prime-field Shamir sharing, X25519 key agreement with raw keys) and with the integer grid of distributed placement
(``fedfilter.protocol.secagg.grid``: ``secaggplus_settings``, ``encode_report``, ``decode_sum``), on the
neighbourhood graph the coordinator ships by default (``coordinator.secure_round.round_graph`` for
``min-reports = ceil(clients * --min-reports-fraction)``, default a half, and ``--num-shares``, default
``auto``: the sparse graph). The devices' rule ties the graph to min-reports (``t >= min-reports``,
``2 t > k``), so the fraction is what sets k and t, and with them the secure round's cost.

The clients: the built-in digits task, ``local-epochs`` epochs of SGD (``fedfilter.app.task``), the
update clipped to C = 0.4 and snapped toward zero on the grid (``mechanism.snap_toward_zero``); a plain
client sends ``k * step`` in float32, a secure one ``encode_report(k, q)`` under SecAgg+ masks. The
coordinator decodes and applies the mean (``w + mean``) in both (and checks that every unmasked
sum equals the sum of the integer reports the clients sent, exactly), so the model trains the same way
whichever variant a round uses; plain and secure rounds alternate (after ``--warmup`` untimed rounds
of each), so machine load hits both alike. No noise and no accounting: this is the cost of the
secure-aggregation protocol itself (``benchmarks/flower_overhead.py`` measures the filter's).

Printed per federation size: median seconds per round for each variant, their ratio, and the split
into client compute (summed over the clients, per client-round) and everything else (server
workflow, wire format), as measured around each ClientApp call; the server's seconds in the unmask
stage (its wall time minus the clients' time inside it: Shamir combine, mask regeneration,
dequantization); then the seconds per secure round spent inside SecAgg+'s primitives (Shamir split on
the clients and combine on the server; ECDH key agreement; share encryption; masks; the consistency
round's key checks, making and checking the survivor-set MACs on the clients), the CPU seconds
of each variant's round and of the server's unmasking (``time.process_time``: the whole in-process
federation's CPU, which the load of other jobs on the machine does not inflate), and the peak
resident memory of the process.

``--profile FILE``: after the timed rounds, one more secure round (untimed, without the primitives'
timers) under ``cProfile``; its stats go to ``FILE`` (``python -m pstats FILE``) and the script prints
the entries with the most own time and that time grouped by where the code lives (``round_profile.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/harness: drivers not shipped

CLIP = 0.4


def _client_app(task, pid_of: dict, sent: dict, clip: float, local_epochs: int, lr: float, product: bool):
    """A legacy NumPyClient per node (what SecAgg+ needs); ``config["secagg"]`` picks the encoding."""
    import numpy as np
    from flwr.client import NumPyClient
    from flwr.clientapp import ClientApp

    from fedfilter.app.task import local_update, set_weights
    from fedfilter.client.mechanisms.gaussian import snap_toward_zero
    from fedfilter.protocol.secagg.grid import encode_report, grid_step

    step = grid_step(clip)

    class Client(NumPyClient):
        def __init__(self, pid: int):
            self.pid = pid

        def fit(self, parameters, config):
            model = task.model_fn()
            set_weights(model, parameters)
            x, y = task.train_data[self.pid]
            local_update(model, x, y, epochs=local_epochs, lr=lr, batch_size=32, seed=int(config["round"]) + self.pid)
            new = [v.detach().numpy().astype(np.float64) for v in model.state_dict().values()]
            delta = [n - np.asarray(p, dtype=np.float64) for n, p in zip(new, parameters)]
            norm = math.sqrt(sum(float(np.sum(d * d)) for d in delta))
            scale = min(1.0, clip / norm) if norm > 0 else 1.0
            k = snap_toward_zero([d * scale for d in delta], step)  # int64 multiples of step
            if config["secagg"]:
                sent[int(config["round"])].append(k)  # the benchmark's own check of the unmasked sum
                return encode_report(k, int(config["q"])), 1, {}
            return [(ki * step).astype(np.float32) for ki in k], 1, {}

    def client_fn(ctx):
        return Client(pid_of[ctx.node_id]).to_client()

    from flwr.client.mod import secaggplus_mod

    from fedfilter.client.secagg.mod import secure_aggregation_mod

    # The same client, bare for plain rounds and inside the SecAgg+ mod for secure ones.
    mod = secure_aggregation_mod if product else secaggplus_mod
    return ClientApp(client_fn=client_fn), ClientApp(client_fn=client_fn, mods=[mod])


def _strategy(weights_ref: list, clip: float, q: int, sent: dict):
    """Legacy FedAvg whose aggregate is ``w + mean(update)``; under SecAgg+ the mean is decoded exactly."""
    import numpy as np
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvg

    from fedfilter.protocol.secagg.grid import decode_sum, grid_step

    step = grid_step(clip)

    class MeanUpdate(FedAvg):
        secagg = False

        def aggregate_fit(self, server_round, results, failures):
            if not results:
                return None, {}
            if self.secagg:  # one unmasked sum, handed over once per active node
                n = len(results)
                total = decode_sum(parameters_to_ndarrays(results[0][1].parameters), n, q)
                expected = [np.sum([k[i] for k in sent[server_round]], axis=0) for i in range(len(total))]
                if len(sent[server_round]) != n or any(not np.array_equal(t, e) for t, e in zip(total, expected)):
                    raise RuntimeError(f"round {server_round}: the unmasked sum is not the sum of the integer reports")
                mean = [t.astype(np.float64) * step / n for t in total]
            else:
                updates = [parameters_to_ndarrays(r.parameters) for _, r in results]
                mean = [np.mean([u[i].astype(np.float64) for u in updates], axis=0) for i in range(len(updates[0]))]
            weights_ref[0] = [(w + m).astype(w.dtype) for w, m in zip(weights_ref[0], mean)]
            return ndarrays_to_parameters(weights_ref[0]), {}

    return MeanUpdate(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=1,
        min_evaluate_clients=0,
        min_available_clients=1,
    )


# SecAgg+'s primitives, timed where Flower's client mod and server workflow call them (fedfilter's Shamir,
# masks and key agreement once installed; Flower's share encryption), and the consistency round's where
# fedfilter's device mod calls them.
_PRIMITIVES = {
    "flwr.client.mod.secure_aggregation.secaggplus_mod": (
        "generate_key_pairs",
        "bytes_to_private_key",
        "bytes_to_public_key",
        "create_shares",
        "generate_shared_key",
        "encrypt",
        "decrypt",
        "pseudo_rand_gen",
    ),
    "flwr.server.workflow.secure_aggregation.secaggplus_workflow": (
        "combine_shares",
        "generate_shared_key",
        "pseudo_rand_gen",
    ),
    "fedfilter.client.secagg.mod": (
        "public_key_problems",
        "decrypt_share",
        "survivors_tag",
        "check_tags",
    ),
}


def time_primitives(spent: dict[str, float]):
    """Wrap each primitive (after the mask generator was installed) to add its wall time to ``spent``;
    returns a function that puts the originals back. The device's mod re-installs fedfilter's primitives
    at every message (``use_cryptographic_masks``, a cheap check once installed, a sweep of every loaded
    module when not): it is wrapped to run with the primitives it installed in place, then to put the
    timers back."""
    import importlib

    from fedfilter.client.secagg import mod as secagg_device

    undo = []
    timers = []
    install = secagg_device.use_cryptographic_masks

    def install_then_time() -> None:
        for module, name, original in undo:  # what the device's mod finds when nothing is timed
            setattr(module, name, original)
        install()
        for module, name, timer in timers:
            setattr(module, name, timer)

    secagg_device.use_cryptographic_masks = install_then_time

    for module_name, names in _PRIMITIVES.items():
        module = importlib.import_module(module_name)
        side = "server" if "workflow" in module_name else "client"
        for name in names:
            original = getattr(module, name)

            def timed(*a, _f=original, _key=f"{side} {name}", **kw):
                started = time.perf_counter()
                try:
                    return _f(*a, **kw)
                finally:
                    spent[_key] += time.perf_counter() - started

            setattr(module, name, timed)
            timers.append((module, name, timed))
            undo.append((module, name, original))

    def restore() -> None:
        secagg_device.use_cryptographic_masks = install
        for module, name, original in undo:
            setattr(module, name, original)

    return restore


def run_size(n: int, args) -> dict:
    import resource

    import numpy as np
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.compat.app_utils import start_update_client_manager_thread
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
    from flwr.server.workflow.default_workflows import default_fit_workflow
    from harness.secagg_loopback import LoopbackGrid

    from fedfilter.app.task import evaluate, get_weights, load_task, set_weights
    from fedfilter.coordinator.secagg.consistency import ConsistencyCheckedSecAggPlus
    from fedfilter.coordinator.secagg.secure_round import round_graph
    from fedfilter.protocol.secagg.grid import secaggplus_settings
    from fedfilter.protocol.secagg.masks import use_cryptographic_masks

    use_cryptographic_masks()  # both sides run in this process: one install covers them
    primitive_s: dict[str, float] = defaultdict(float)
    restore = time_primitives(primitive_s)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = load_task("digits", n)
    model = task.model_fn()
    weights = [np.asarray(w) for w in get_weights(model)]
    nodes = [1000 + i for i in range(n)]
    pid_of = {nid: i for i, nid in enumerate(nodes)}
    settings = secaggplus_settings(n)
    q = settings["quantization_range"]
    sent: dict[int, list] = defaultdict(list)  # round -> the integer reports the secure clients sent
    product = args.workflow == "product"
    plain_app, secure_app = _client_app(task, pid_of, sent, CLIP, args.local_epochs, args.lr, product)
    client_time = {"plain": 0.0, "secagg": 0.0}
    client_cpu = {"plain": 0.0, "secagg": 0.0}  # CPU seconds (process_time): robust to machine load
    current = {"variant": "plain"}

    stages: set[str] = set()  # the SecAgg+ stages the clients were sent

    def node_app(msg, ctx):
        started, cpu_started = time.perf_counter(), time.process_time()
        configs = msg.content.get(RECORD_KEY_CONFIGS)
        app = secure_app if isinstance(configs, ConfigRecord) else plain_app
        if app is secure_app:
            stages.add(str(configs.get("stage")))
        reply = app(msg, ctx)
        client_time[current["variant"]] += time.perf_counter() - started
        client_cpu[current["variant"]] += time.process_time() - cpu_started
        return reply

    grid = LoopbackGrid({nid: node_app for nid in nodes}, record=False)  # keeps no message: see its docstring
    min_reports = math.ceil(n * args.min_reports_fraction)
    graph = round_graph(n, min_reports, args.num_shares)  # the coordinator's own choice
    threshold = graph.threshold
    shares = 1.0 if graph.num_shares == n else graph.num_shares  # as run_secure_round passes it to Flower
    workflow = ConsistencyCheckedSecAggPlus if product else SecAggPlusWorkflow
    secagg = workflow(num_shares=shares, reconstruction_threshold=threshold, **settings)
    unmask_s: list[float] = []
    unmask_cpu_s: list[float] = []
    original_unmask = secagg.unmask_stage

    def timed_unmask(grid_, context_, state_):
        started, clients_before = time.perf_counter(), client_time["secagg"]
        cpu_started, clients_cpu_before = time.process_time(), client_cpu["secagg"]
        try:
            return original_unmask(grid_, context_, state_)
        finally:
            unmask_s.append(time.perf_counter() - started - (client_time["secagg"] - clients_before))
            unmask_cpu_s.append(time.process_time() - cpu_started - (client_cpu["secagg"] - clients_cpu_before))

    secagg.unmask_stage = timed_unmask
    ref = [weights]
    strategy = _strategy(ref, CLIP, q, sent)
    context = LegacyContext(
        Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config={}),
        config=ServerConfig(num_rounds=1),
        strategy=strategy,
    )
    thread, stop, done = start_update_client_manager_thread(grid, context.client_manager)
    done.wait()
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord(weights)
    cfg = ConfigRecord({Key.START_TIME: time.time()})
    context.state.config_records[MAIN_CONFIGS_RECORD] = cfg
    times: dict[str, list[float]] = {"plain": [], "secagg": []}
    cpu_times: dict[str, list[float]] = {"plain": [], "secagg": []}
    primitives_timed: dict[str, float] = defaultdict(float)
    per_client: dict[str, list[float]] = {"plain": [], "secagg": []}
    round_id = 0
    try:
        for timed in [False] * args.warmup + [True] * args.rounds:
            for variant in ("plain", "secagg"):
                round_id += 1
                cfg[Key.CURRENT_ROUND] = round_id
                current["variant"], strategy.secagg = variant, variant == "secagg"
                strategy.on_fit_config_fn = lambda r, v=variant: {"secagg": v == "secagg", "q": q, "round": r}
                before, before_primitives = client_time[variant], dict(primitive_s)
                started, cpu_started = time.perf_counter(), time.process_time()
                (secagg if variant == "secagg" else default_fit_workflow)(grid, context)
                elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
                if timed:
                    times[variant].append(elapsed)
                    cpu_times[variant].append(cpu)
                    per_client[variant].append((client_time[variant] - before) / n)
                    for key, value in primitive_s.items():
                        primitives_timed[key] += (value - before_primitives.get(key, 0.0)) / args.rounds
        unmask_s, unmask_cpu_s = unmask_s[-args.rounds :], unmask_cpu_s[-args.rounds :]  # the timed rounds'
        if args.profile:
            restore()  # the primitives' timers would be profiled too
            round_id += 1
            cfg[Key.CURRENT_ROUND] = round_id
            current["variant"], strategy.secagg = "secagg", True
            strategy.on_fit_config_fn = lambda r: {"secagg": True, "q": q, "round": r}
            from round_profile import profiled_round

            profiled_round(lambda: secagg(grid, context), args.profile)
    finally:
        restore()
        stop.set()
        thread.join()
    set_weights(model, ref[0])
    _, accuracy = evaluate(model, *task.test_data, loss_fn=task.loss)
    plain, sec = statistics.median(times["plain"]), statistics.median(times["secagg"])
    return {
        "clients": n,
        "workflow": args.workflow,
        "min_reports": min_reports,
        "threshold": threshold,
        "num_shares": graph.num_shares,
        "abort_probability": graph.abort_probability,
        "server_unmask_s": statistics.median(unmask_s),
        "server_unmask_cpu_s": statistics.median(unmask_cpu_s),
        "plain_cpu_s_per_round": statistics.median(cpu_times["plain"]),
        "secagg_cpu_s_per_round": statistics.median(cpu_times["secagg"]),
        "cpu_ratio": statistics.median(cpu_times["secagg"]) / statistics.median(cpu_times["plain"]),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "quantization_range": q,
        "plain_s_per_round": plain,
        "secagg_s_per_round": sec,
        "ratio": sec / plain,
        "plain_client_s_per_client_round": statistics.median(per_client["plain"]),
        "secagg_client_s_per_client_round": statistics.median(per_client["secagg"]),
        "plain_rest_s_per_round": plain - n * statistics.median(per_client["plain"]),
        "secagg_rest_s_per_round": sec - n * statistics.median(per_client["secagg"]),
        "rounds_timed": args.rounds,
        "secagg_stages": sorted(stages),
        "accuracy_after": float(accuracy),
        # mean seconds per secure round inside each SecAgg+ primitive (all clients, or the server)
        "primitive_s_per_round": {k: round(v, 6) for k, v in sorted(primitives_timed.items())},
        "unmasked_sums_checked": sum(1 for r in sent.values() if r),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each variant (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds of each variant first (default 1)")
    parser.add_argument(
        "--num-shares", default="auto", help="SecAgg+ neighbourhoods: auto (default), a share of the nodes, an odd int"
    )
    parser.add_argument(
        "--min-reports-fraction",
        type=float,
        default=0.5,
        help="min-reports as a share of the clients, rounded up (default 0.5); it sets the graph's k and t",
    )
    parser.add_argument(
        "--workflow",
        choices=("product", "flower"),
        default="product",
        help="product: fedfilter's ConsistencyCheckedSecAggPlus + secure_aggregation_mod (default); "
        "flower: Flower's bare SecAggPlusWorkflow + secaggplus_mod",
    )
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--profile", type=Path, default=None, help="profile one more secure round (after the timed ones) into this file"
    )
    args = parser.parse_args(argv)
    if not 0.0 < args.min_reports_fraction <= 1.0:
        parser.error(f"--min-reports-fraction must be in (0, 1]. Found {args.min_reports_fraction}.")
    import torch

    print(
        f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"python {platform.python_version()}; in-process LoopbackGrid rounds (no Ray), digits MLP; "
        f"secure rounds: {args.workflow} workflow"
    )
    print(
        "| clients | shares k | threshold t | min-reports | plain s/round | SecAgg+ s/round | ratio "
        "| client ms/client-round plain / SecAgg+ | rest s/round plain / SecAgg+ | server unmask s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for n in args.clients:
        row = run_size(n, args)
        rows.append(row)
        print(
            f"| {n} | {row['num_shares']} | {row['threshold']} | {row['min_reports']} | "
            f"{row['plain_s_per_round']:.3f} | "
            f"{row['secagg_s_per_round']:.3f} | {row['ratio']:.2f} | "
            f"{1e3 * row['plain_client_s_per_client_round']:.1f} / "
            f"{1e3 * row['secagg_client_s_per_client_round']:.1f} | {row['plain_rest_s_per_round']:.3f} / "
            f"{row['secagg_rest_s_per_round']:.3f} | {row['server_unmask_s']:.3f} |",
            flush=True,
        )
    for row in rows:
        shown = ", ".join(f"{k} {v:.3f}" for k, v in row["primitive_s_per_round"].items())
        print(f"# {row['clients']} clients, s per SecAgg+ round inside its primitives: {shown}")
        print(
            f"#   CPU s/round plain {row['plain_cpu_s_per_round']:.3f}, SecAgg+ {row['secagg_cpu_s_per_round']:.3f} "
            f"(ratio {row['cpu_ratio']:.2f}); server unmask CPU s {row['server_unmask_cpu_s']:.3f}; peak RSS "
            f"{row['peak_rss_mib']:.0f} MiB; unmasked sums checked {row['unmasked_sums_checked']}"
        )
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
