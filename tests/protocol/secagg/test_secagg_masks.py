"""The AES-256-CTR mask generator that replaces Flower's 32-bit Mersenne Twister masks in SecAgg+.

Flower's generator is the reference for layout (shapes, dtypes); the weakness it has (flwrlabs/flower#7522)
is shown with Flower's own function, so these tests fail if the override is not in place.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest
from scipy import stats

from fedfilter.protocol.secagg import shamir as secagg_shamir
from fedfilter.protocol.secagg.masks import (
    aes_mask_gen,
    cryptographic_masks,
    cryptographic_masks_installed,
    mask_key,
    restore,
    use_cryptographic_masks,
)

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only (before Ray starts)

UTILS = "flwr.common.secure_aggregation.secaggplus_utils"
CLIENT_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
SERVER_WORKFLOW = "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
SHAMIR = "flwr.common.secure_aggregation.crypto.shamir"
SHAPES = [(3, 4), (), (7,), (2, 0, 5), (2, 3, 2)]


def _module(name):
    # import_module, not `import a.b.c as m`: flwr.client.mod.secure_aggregation re-exports a function
    # named secaggplus_mod that shadows the module of the same name.
    return importlib.import_module(name)


def _flower_generator():
    return _module(UTILS).pseudo_rand_gen


@pytest.fixture(autouse=True)
def _flower_generator_back():
    restore()
    yield
    restore()


def _folded_twins():
    """Two 32-byte seeds that differ only above bit 32 and fold to the same 32-bit seed in Flower."""
    seed = bytearray(os.urandom(32))
    twin = bytearray(seed)
    twin[4] ^= 0x5A  # word 1 and word 2 change by the same XOR, so word1 ^ word2 is unchanged
    twin[8] ^= 0x5A
    return bytes(seed), bytes(twin)


def test_layout_matches_flowers_generator():
    seed = os.urandom(32)
    for num_range in (2, 16, 1000, 2**32):
        ours = aes_mask_gen(seed, num_range, SHAPES)
        flowers = _flower_generator()(seed, num_range, SHAPES)
        assert len(ours) == len(flowers) == len(SHAPES)
        for mine, theirs in zip(ours, flowers, strict=True):
            assert mine.shape == theirs.shape
            assert mine.dtype == theirs.dtype == np.int64
            assert isinstance(mine, np.ndarray)
            if mine.size:
                assert 0 <= mine.min() and mine.max() < num_range


def test_top_value_is_reached():
    # Flower draws randint(0, num_range - 1), never num_range - 1; a mask must cover all of Z_m.
    (masks,) = aes_mask_gen(os.urandom(32), 4, [(1000,)])
    assert set(np.unique(masks).tolist()) == {0, 1, 2, 3}
    (flowers,) = _flower_generator()(os.urandom(32), 4, [(1000,)])
    assert 3 not in flowers


def test_same_seed_same_masks_and_different_seeds_differ():
    seed, other = os.urandom(32), os.urandom(32)
    first = aes_mask_gen(seed, 2**32, SHAPES)
    again = aes_mask_gen(seed, 2**32, SHAPES)
    different = aes_mask_gen(other, 2**32, SHAPES)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], different[0])
    assert not np.array_equal(first[4], different[4])


def test_masks_do_not_depend_on_batching():
    # Client and server must agree on the masks; the stream is sliced the same way whatever the shapes.
    seed = os.urandom(44)
    joined = np.concatenate([m.ravel() for m in aes_mask_gen(seed, 1000, [(5,), (3, 2), ()])])
    flat = aes_mask_gen(seed, 1000, [(12,)])[0]
    np.testing.assert_array_equal(joined, flat)


def test_seeds_differing_above_32_bits_give_different_masks():
    seed, twin = _folded_twins()
    # The bug (flwrlabs/flower#7522): Flower's generator folds both to one 32-bit seed.
    for a, b in zip(_flower_generator()(seed, 2**32, SHAPES), _flower_generator()(twin, 2**32, SHAPES), strict=True):
        np.testing.assert_array_equal(a, b)
    # The fix, called where SecAgg+ calls it: through the client mod's and the server workflow's name.
    with cryptographic_masks():
        for name in (CLIENT_MOD, SERVER_WORKFLOW):
            generator = _module(name).pseudo_rand_gen
            assert not np.array_equal(generator(seed, 2**32, [(64,)])[0], generator(twin, 2**32, [(64,)])[0])


def test_key_uses_the_full_seed_and_rejects_bad_input():
    seed, twin = _folded_twins()
    assert mask_key(seed) != mask_key(twin)
    assert mask_key(seed + b"\x00") != mask_key(seed)  # length is part of the key derivation
    with pytest.raises(ValueError, match="seed"):
        aes_mask_gen(b"", 16, [(2,)])
    with pytest.raises(TypeError, match="seed"):
        aes_mask_gen("text", 16, [(2,)])
    with pytest.raises(ValueError, match=r"num_range.*0"):
        aes_mask_gen(b"k" * 32, 0, [(2,)])
    with pytest.raises(ValueError, match="num_range"):
        aes_mask_gen(b"k" * 32, 2**63 + 1, [(2,)])
    with pytest.raises(ValueError, match=r"dimensions_list\[1\]"):
        aes_mask_gen(b"k" * 32, 16, [(2,), (-1,)])
    for bad in (True, 2.0, "2"):
        with pytest.raises(ValueError, match=r"dimensions_list\[0\]"):
            aes_mask_gen(b"k" * 32, 16, [(bad,)])
    # numpy ints in a shape (a caller other than Flower's ndarray.shape) give what Python ints give
    numpy_shapes = aes_mask_gen(b"k" * 32, 16, [(np.int64(2), np.int32(3)), ()])
    int_shapes = aes_mask_gen(b"k" * 32, 16, [(2, 3), ()])
    assert [a.shape for a in numpy_shapes] == [(2, 3), ()]
    assert all(np.array_equal(a, b) for a, b in zip(numpy_shapes, int_shapes))


def test_masks_are_the_aes256_ctr_keystream_of_an_independent_implementation():
    # pycryptodome's AES in CTR mode (a 128-bit big-endian counter from 0), keyed by mask_key(seed): for
    # SecAgg+'s modulus 2**32 every little-endian 32-bit word is a mask, in order.
    from Crypto.Cipher import AES

    seed = os.urandom(32)
    keystream = AES.new(mask_key(seed), AES.MODE_CTR, nonce=b"", initial_value=0).encrypt(bytes(4 * 1000))
    expected = np.frombuffer(keystream, dtype="<u4").astype(np.int64)
    np.testing.assert_array_equal(
        np.concatenate([m.ravel() for m in aes_mask_gen(seed, 2**32, [(10, 50), (500,)])]), expected
    )
    # A range that is not a power of two: the accepted 32-bit words (w < 2**32 - 2**32 mod r), mod r.
    r = 3 * 10**9
    words = np.frombuffer(
        AES.new(mask_key(seed), AES.MODE_CTR, nonce=b"", initial_value=0).encrypt(bytes(4 * 4000)), "<u4"
    )
    accepted = words[words < 2**32 - 2**32 % r][:1000].astype(np.int64) % r
    np.testing.assert_array_equal(aes_mask_gen(seed, r, [(1000,)])[0], accepted)


# Each chi-square test below has false-alarm probability 1e-3 under exact uniformity (its p-value is
# uniform on [0, 1]); the seeds are fixed, so a pass is reproducible and a failure is not flakiness.
@pytest.mark.parametrize("num_range", [16, 10, 1000])
def test_uniform_chi_square(num_range):
    (draws,) = aes_mask_gen(b"fedfilter chi-square seed 000001", num_range, [(100_000,)])
    counts = np.bincount(draws, minlength=num_range)
    assert counts.size == num_range
    assert stats.chisquare(counts).pvalue > 1e-3


def test_secaggplus_modulus_is_uniform_in_its_top_bits():
    (draws,) = aes_mask_gen(b"fedfilter chi-square seed 000003", 2**32, [(200_000,)])
    counts = np.bincount((draws >> 24).astype(np.int64), minlength=256)
    assert counts.size == 256 and stats.chisquare(counts).pvalue > 1e-3
    low = np.bincount((draws & 0xFF).astype(np.int64), minlength=256)
    assert stats.chisquare(low).pvalue > 1e-3


def test_no_modulo_bias_for_a_wide_non_power_of_two_range():
    # num_range = 3 * 2**61: a plain `word mod num_range` would give values below 2**62 three preimages
    # and the others two, i.e. the first 4 of 6 equal bins 3/2 times as likely. Rejection removes that.
    num_range = 3 * 2**61
    (draws,) = aes_mask_gen(b"fedfilter chi-square seed 000002", num_range, [(100_000,)])
    bins = (draws.astype(np.uint64) // np.uint64(2**60)).astype(np.int64)
    counts = np.bincount(bins, minlength=6)
    assert counts.size == 6
    assert stats.chisquare(counts).pvalue > 1e-3


def _pairwise_masked(x, nid, keys, public, mod_range, generator):
    """What secaggplus_mod does in COLLECT_MASKED_VECTORS: + mask for a smaller peer id, - for a larger."""
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key

    y = x.copy()
    for peer, peer_public in public.items():
        if peer == nid:
            continue
        (mask,) = generator(generate_shared_key(keys[nid], peer_public), mod_range, [x.shape])
        y = y + mask if nid > peer else y - mask
    return np.mod(y, mod_range)


def test_pairwise_masks_cancel_mod_the_modulus():
    from flwr.supercore.primitives.asymmetric import generate_key_pairs

    mod_range = 2**32
    rng = np.random.default_rng(7)
    nids = [11, 42, 7, 300]
    keys, public = {}, {}
    for nid in nids:
        keys[nid], public[nid] = generate_key_pairs()
    inputs = {nid: rng.integers(0, 2**20, size=(6, 5), dtype=np.int64) for nid in nids}
    with cryptographic_masks():
        generator = _module(CLIENT_MOD).pseudo_rand_gen
        assert generator is aes_mask_gen
        masked = {nid: _pairwise_masked(inputs[nid], nid, keys, public, mod_range, generator) for nid in nids}
    for nid in nids:  # each report alone is masked
        assert not np.array_equal(masked[nid], inputs[nid])
    total = np.mod(sum(masked.values()), mod_range)
    np.testing.assert_array_equal(total, np.mod(sum(inputs.values()), mod_range))


def test_installer_is_idempotent_and_restorable():
    original = _flower_generator()
    create, combine = _module(SHAMIR).create_shares, _module(SHAMIR).combine_shares
    use_cryptographic_masks()
    use_cryptographic_masks()
    assert cryptographic_masks_installed()
    for name in (UTILS, CLIENT_MOD, SERVER_WORKFLOW):
        assert _module(name).pseudo_rand_gen is aes_mask_gen
    for name in (SHAMIR, CLIENT_MOD):
        assert _module(name).create_shares is secagg_shamir.create_shares
    for name in (SHAMIR, SERVER_WORKFLOW):
        assert _module(name).combine_shares is secagg_shamir.combine_shares
    restore()
    assert not cryptographic_masks_installed()
    for name in (UTILS, CLIENT_MOD, SERVER_WORKFLOW):
        assert _module(name).pseudo_rand_gen is original
    assert _module(CLIENT_MOD).create_shares is create and _module(SERVER_WORKFLOW).combine_shares is combine
    with cryptographic_masks():
        assert cryptographic_masks_installed()
    assert _module(CLIENT_MOD).pseudo_rand_gen is original
    assert _module(CLIENT_MOD).create_shares is create


def test_installed_is_false_when_one_call_site_runs_flowers_primitive(monkeypatch):
    flowers_combine = _module(SHAMIR).combine_shares
    use_cryptographic_masks()
    assert cryptographic_masks_installed()
    monkeypatch.setattr(_module(SERVER_WORKFLOW), "combine_shares", flowers_combine)
    assert not cryptographic_masks_installed()


def test_installer_also_replaces_other_flower_importers(monkeypatch):
    # A future flwr module that does `from ...secaggplus_utils import pseudo_rand_gen` is found by scanning.
    import types

    importer = types.ModuleType("flwr.some_future_importer")
    importer.pseudo_rand_gen = _flower_generator()
    monkeypatch.setitem(sys.modules, importer.__name__, importer)
    with cryptographic_masks():
        assert importer.pseudo_rand_gen is aes_mask_gen
    assert importer.pseudo_rand_gen is _flower_generator()


# --- end to end: Flower's SecAgg+ in the Simulation Engine with the override on both sides -------------

E2E_CLIENTS = 4
E2E_CLIP = 8.0
E2E_LEVELS = 16  # quantizer = levels / (2 * clip) = 1: integer updates in [-8, 8] are on the grid


def _e2e_update(partition_id):
    # Integer values on SecAgg+'s grid, so its stochastic rounding is a no-op and the sum is exact.
    return [np.array([[partition_id - 2, 3], [-(partition_id % 3), 8]], dtype=np.float64), np.array([partition_id])]


def _install_masks_mod(message, context, call_next):
    """Outermost client mod: the override must be in place in the process that runs the ClientApp."""
    use_cryptographic_masks()
    return call_next(message, context)


def _e2e_client_app():
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod

    class _FixedClient(NumPyClient):
        def __init__(self, partition_id):
            self.partition_id = partition_id

        def fit(self, parameters, config):
            return _e2e_update(self.partition_id), 1, {}

    def client_fn(context):
        return _FixedClient(int(context.node_config["partition-id"])).to_client()

    return ClientApp(client_fn=client_fn, mods=[_install_masks_mod, secaggplus_mod])


def _e2e_server_app(seen):
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    class _Recording(FedAvg):
        def aggregate_fit(self, server_round, results, failures):
            seen["results"] = len(results)
            seen["aggregate"] = parameters_to_ndarrays(results[0][1].parameters)
            seen["installed"] = cryptographic_masks_installed()
            return super().aggregate_fit(server_round, results, failures)

    app = ServerApp()

    @app.main()
    def main(grid, context):
        use_cryptographic_masks()
        initial = ndarrays_to_parameters([np.zeros((2, 2)), np.zeros(1)])
        strategy = _Recording(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=E2E_CLIENTS,
            min_available_clients=E2E_CLIENTS,
            initial_parameters=initial,
        )
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
        workflow = DefaultWorkflow(
            fit_workflow=SecAggPlusWorkflow(
                num_shares=3,
                reconstruction_threshold=2,
                max_weight=1,
                clipping_range=E2E_CLIP,
                quantization_range=E2E_LEVELS,
            )
        )
        workflow(grid, legacy)

    return app


@pytest.mark.slow
def test_secaggplus_in_simulation_unmasks_the_exact_sum_with_the_override():
    import cloudpickle
    from flwr.simulation import run_simulation

    # The Ray actors cannot import this test module by name: ship its functions by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    seen: dict = {}
    try:
        run_simulation(
            server_app=_e2e_server_app(seen),
            client_app=_e2e_client_app(),
            num_supernodes=E2E_CLIENTS,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert seen.get("installed") is True
    assert seen["results"] == E2E_CLIENTS
    expected = [sum(arrays) for arrays in zip(*(_e2e_update(p) for p in range(E2E_CLIENTS)), strict=True)]
    # The workflow releases the mean of the unmasked sum; any mask left over would be off by ~2**31.
    for released, exact in zip(seen["aggregate"], expected, strict=True):
        np.testing.assert_allclose(released * E2E_CLIENTS, exact, rtol=0, atol=1e-9)
