"""The vectorised engine: the Flower path's privacy code, applied to many clients in one process.

For studies that would take days as separate Flower clients (for example
60,000 single-example clients). Every privacy decision is made by the code a Flower device runs
(``fedfilter.privacy.filters.round_allowance`` / ``exhausted`` / ``charge`` / ``admits`` / ``spend``
and ``fedfilter.client.mechanisms.gaussian.certified_norm`` / ``clip_to_norm`` / ``add_grid_noise``), broadcast
over a leading client axis, so the same seeds give bitwise the same per-client spending
(``tests/simulations/engine/test_engine_conformance.py``).

Public API
==========

``EngineConfig`` (frozen dataclass; every field documented on the class)
    task / num_clients / partition / alpha / partition_seed, client_mode (``auto``,
    ``single-example``, ``multi-example``), epsilon (one value or one per client), delta,
    filter_kind (``gdp``, ``zcdp``, ``rdp``), run_quota, noise_multiplier, clip, placement
    (``local``, ``distributed`` (rdp only), ``central``), min_reports, after_exhaustion (``noise-only``, ``leave``; one
    value or one per client), exhausted_below, accounting (``individual``; ``worst-case``: every
    contribution charged a full round, simulation only), noise_draw (``per-client``, ``aggregate``),
    adaptive_clipping (``fedfilter.protocol.adaptive_clip.AdaptiveClipping`` or None: the clip follows a
    quantile of the update norms, ``noise_multiplier`` then the accounted ``z_eff``),
    rounds, fraction, participation (``uniform``, ``balanced``), local_epochs, lr, batch_size,
    server_lr, seed, run_id, model_fn,
    eval_every, group_by (``label``, ``client``, ``none``), norms (``device``, ``vectorised``,
    ``fast``), chunk_size, torch_threads.

``run_engine(config, progress=None, *, task=None) -> EngineResult``
    Runs ``config.rounds`` rounds; calls ``progress(record)`` with each ``RoundRecord``.
    ``task``: a prebuilt ``fedfilter.simulations.tasks.registry.Task`` (e.g. a subset) instead of loading
    ``config.task``.

``Engine(config, task=None)``
    The same, one round at a time: ``step() -> RoundRecord``, ``evaluate()``,
    ``train_accuracy()``, ``allowance(clients)``, ``round_numbers()`` (the next round's release:
    multiplier, norm bound, clip), ``result() -> EngineResult``; attributes
    ``weights`` (state_dict order), ``state`` / ``run_state`` (``(n_clients, dim)`` float64),
    ``exhausted_round``, ``round_id``.

``RoundRecord`` (one per round)
    ``round_id``; ground truth: ``contributing`` (clients whose data entered the round),
    ``noise_only``, ``exhausted_total``; what the coordinator saw: ``reports_seen`` (noise-only
    reports count as reports, ``left`` markers do not), ``left``, ``released``,
    ``aggregate_norm``; evaluation (when evaluated): ``accuracy``, ``loss``,
    ``group_accuracy`` (label class -> test accuracy, or client id -> accuracy on its own
    data); ``sampled``, ``seconds``; public: ``clip`` (the round's C) and, with adaptive clipping,
    ``unclipped_fraction`` (the released bit's estimate).

``EngineResult``
    ``rounds`` (list of ``RoundRecord``; shortcuts ``accuracy``, ``contributing``,
    ``reports_seen``), per client: ``exhausted_round`` (first round the client had nothing
    left, -1 if never), ``spent_epsilon``, ``spent_fraction``, ``state``, ``run_state``; and
    ``client_ids``, ``weights``, ``group_accuracy`` (last evaluation), ``config``.

``client_noise_seed(seed, k)``
    The ``noise-seed`` to give Flower device ``k`` so that it draws the same noise as client
    ``k`` of an engine run seeded ``seed`` (``noise_draw="per-client"``).

Agreement with the Flower path, precisely
=========================================
* multi-example clients: the local update is ``fedfilter.app.client_app.train``'s (same
  ``local_update``, same shuffling seed ``1_000_003 * round + partition_id``, same float32
  difference); with the same torch thread count (the ClientApp uses 1) the updates, the
  certified norms, the charges and the filter states are bitwise equal, and with
  ``noise_draw="per-client"`` every report is too; the aggregate agrees to float64 summation
  order (the coordinator sums replies in arrival order).
* single-example clients report ``-lr * grad`` computed by torch.func in batches: the same
  privacy code, but not bitwise the Flower client's ``(w - lr g) - w`` in float32. With
  ``norms="fast"`` the gradients come from layer hooks instead (``fedfilter.simulations.engine.layerwise``):
  charges certified against each client's exact term, equal to the device functions' to float32
  rounding of the gradient (``tests/simulations/engine/test_engine_conformance.py``,
  ``tests/simulations/engine/test_engine_fast.py``).
* threads: ``torch_threads`` sets torch's (the fast mode's GEMMs and convolutions use both cores);
  a run is bitwise repeatable for the same thread count (on this machine also across 1 and 2).
* ``fraction < 1`` samples with the engine's own generator, not the ServerApp's.
* ``distributed`` placement: each client's release is the device's Skellam rule
  (``fedfilter.simulations.engine.mechanisms.EngineSkellam`` in the device's spend template: Gaussian
  allowance -> Skellam allowance -> clip -> snap toward zero on the SecAgg+ grid -> charge at the exact
  integer norms -> commit, the device's functions in the device's order), so filter states are bitwise a device's; with
  ``noise_draw="per-client"`` each integer report is bitwise the device's, and the integer sum (hence
  the mean) is exact whatever the order. ``norms="fast"`` falls back to ``vectorised`` there.
* adaptive clipping (``fedfilter.simulations.engine.adaptive``): each client's bit is read off the
  certified norm of its update before clipping (the device's ``certified_norm``, or the vectorised
  one), a non-finite update counting as clipped; its release is the augmented vector, one Gaussian or
  Skellam release with the norm bound ``augmented_clip`` and the multiplier ``z_eff``.
* ``central`` placement has no device counterpart: Feldman & Zrnic's trusted curator (private GD), used by
  ``fedfilter.simulations.reproduce``.
"""

from fedfilter.simulations.engine.accounts import spent_epsilon
from fedfilter.simulations.engine.config import EngineConfig, EngineResult, RoundRecord
from fedfilter.simulations.engine.core import Engine, run_engine
from fedfilter.simulations.engine.seeds import client_noise_seed

__all__ = ["EngineConfig", "EngineResult", "RoundRecord", "Engine", "run_engine", "spent_epsilon", "client_noise_seed"]
