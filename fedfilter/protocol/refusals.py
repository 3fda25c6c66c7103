"""The device's refusal codes: one short, stable, machine-readable code per kind of error reply.

``individual_filter_mod`` begins every error reason with ``fedfilter[<code>]: ``; the strategy
wrapper (``coordinator/replies.py``) counts replies by code and prints what each means and which fix
to make ("10 refused: not enrolled ..."). A code, like the rest of an error reply, depends only on
the request and the device's settings (and, after the ledger is opened, on the ledger's health and
the requests answered before), never on the device's data or its budget state; the one exception,
``left``, is the departure of a device in ``after-exhaustion='leave'`` mode: its owner chose that
mode, whose point is that the device stops taking part once its budget is spent, which the
coordinator sees in any case from its absence.

``REFUSALS`` maps each code to what it means and the fix; ``CODE_PATTERN`` matches the
``fedfilter[<code>]: `` prefix.

Examples
--------
>>> reason = refusal_reason("replay", "round 3 was already answered")
>>> reason
'fedfilter[replay]: round 3 was already answered'
>>> refusal_code(reason), REFUSALS[refusal_code(reason)]
('replay', 'the round was already answered (a repeated round gets no second release)')
"""

from __future__ import annotations

import re

__all__ = ["REFUSALS", "refusal_reason", "refusal_code", "CODE_PATTERN"]

# code -> what it means for the operator, and the fix (read by the coordinator; keep them short).
REFUSALS: dict[str, str] = {
    "no-request": (
        "no fedfilter round request in the train message: wrap the server's strategy, "
        "IndividualFilterStrategy(FedAvg(...), noise_multiplier=..., clip=...)"
    ),
    "bad-request": (
        "the round request is malformed: the coordinator fixes the IndividualFilterStrategy argument "
        "the device's reply names"
    ),
    "request-refused": (
        "the device cannot serve the request as sent (the device's reply names why): a distributed round "
        "whose noise does not fit the SecAgg+ range (the coordinator lowers noise_multiplier or samples "
        "fewer nodes), or a device without a worst-case budget (its owner runs `fedfilter ledger worst-case`)"
    ),
    "noise-below-minimum": (
        "noise_multiplier is below the min-noise-multiplier the device's owner set (0.5 unless the owner "
        "changed it; the device's reply names its value): either raise noise_multiplier to at least that "
        "value (the coordinator), or the owner lowers min-noise-multiplier in the device's settings "
        "(a smaller multiplier costs the device more of its budget per round: mu = norm / (z C))"
    ),
    "needs-secure-aggregation": (
        "placement 'distributed' needs SecAgg+ on the device: the app lists "
        "ClientApp(mods=[secure_aggregation_mod, individual_filter_mod]), or the coordinator sends "
        "placement='local'"
    ),
    "secagg-mod-order": (
        "SecAgg+ messages reach individual_filter_mod outside secure_aggregation_mod: put it first, "
        "ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])"
    ),
    # SecAgg+ (client/secagg/mod.py): each family of the device's checks on the coordinator's protocol messages.
    "secagg-placement": "a SecAgg+ round asked for placement 'local' (SecAgg+ quantizes): send placement='distributed'",
    "secagg-setup": (
        "the SecAgg+ parameters fail the device's checks (quantization, modulus, max_weight, clipping range, "
        "sample, share and threshold numbers): run SecAgg+ through IndividualFilterStrategy"
    ),
    "secagg-graph": (
        "the SecAgg+ neighbourhood graph could unmask fewer than min-reports reports, breaks the device's "
        "secagg-* limits, or too few neighbours shared keys (the device's reply says which): the coordinator "
        "raises the threshold or samples more nodes, or the owner relaxes its secagg-* settings"
    ),
    "secagg-stage": "a SecAgg+ stage came out of order or twice in a round: run each stage once, in order",
    "secagg-keys": "a neighbour's public keys were refused (malformed, low-order or repeated keys) at share-keys",
    "secagg-ciphertext": "a share ciphertext or its source list is not one a neighbour sealed for the device",
    "secagg-pinning": (
        "a neighbour's certificate is missing, not sealed for the device, or not by a key its owner pinned "
        "(peer-key pinning): relay every certificate, and only pinned peers"
    ),
    "secagg-pinning-settings": (
        "the device's peer-key pinning settings are unusable: its owner fixes secagg-identity-key and "
        "secagg-pinned-peers"
    ),
    "secagg-consistency": (
        "the survivor set or the neighbours' tags on it failed the consistency check: send every device "
        "the same survivor set and relay the tags unchanged (ConsistencyCheckedSecAggPlus)"
    ),
    "secagg-unmask": "the unmask request's active and dropped lists disagree with the authenticated survivor set",
    "secagg-not-enabled": (
        "a SecAgg+ round reached a device whose owner has not enabled distributed placement: the owner "
        "starts it with `fedfilter supernode --secure-aggregation`, or the coordinator sends placement='local'"
    ),
    "filter-not-rdp": (
        "distributed rounds need the rdp filter: the device's owner enrols it with --filter rdp, "
        "or the coordinator sends placement='local'"
    ),
    "device-settings": (
        "the device's privacy settings are missing or invalid: its owner fixes its node config "
        "(or its entry of the FEDFILTER_DEVICE_SETTINGS file in a simulation)"
    ),
    "not-enrolled": (
        "not enrolled, or its budget ledger is lost or damaged: the device's owner runs `fedfilter ledger enrol`"
    ),
    "ledger-refused": (
        "the device's budget ledger is refused until its owner acts (a restored backup, an older format, "
        "a lost seal): its owner runs the command the device's log names (`fedfilter ledger migrate`, "
        "`accept-restore` or `enrol --recover`)"
    ),
    "ledger-failed": "the device's budget ledger failed (disk full or read-only): its owner checks the device",
    "bad-model": "the train message must hold exactly one readable ArrayRecord, the model: send the model alone",
    "no-float-model": "the model holds no floating-point arrays (int, bool, complex or none): send a float model",
    "run-id-changed": (
        "the round request's run-id changed within one Flower run: send one run-id per Flower run "
        "(IndividualFilterStrategy does)"
    ),
    "replay": "the round was already answered (a repeated round gets no second release)",
    "left": "the device's budget is spent and it leaves (after-exhaustion='leave')",
    "app-not-approved": (
        "the device's owner has not approved this app (the device's reply names its FAB hash); nothing was "
        "installed, imported, trained or spent: the owner approves it with `fedfilter apps approve "
        "APP_DIR_OR_FAB`, or the coordinator runs an app the owners approved"
    ),
    "evaluate-refused": (
        "client-side evaluation is refused (unaccounted release of private data): "
        "evaluate on the server with start(evaluate_fn=...)"
    ),
}

CODE_PATTERN = re.compile(r"^fedfilter\[([a-z0-9-]{1,40})\]: ")


def refusal_reason(code: str, text: str) -> str:
    """The reason an error reply carries: ``fedfilter[<code>]: <text>``.

    Parameters
    ----------
    code : str
        A code of ``REFUSALS``.
    text : str
        What is wrong, for the operator.

    Returns
    -------
    str
        The reason.

    Raises
    ------
    ValueError
        For an unknown code.

    Examples
    --------
    >>> refusal_reason("not-enrolled", "no ledger")
    'fedfilter[not-enrolled]: no ledger'
    """
    if code not in REFUSALS:
        raise ValueError(f"unknown refusal code {code!r}; known: {sorted(REFUSALS)}.")
    return f"fedfilter[{code}]: {text}"


def refusal_code(reason: str | None) -> str | None:
    """The code an error reason starts with, or ``None`` if it is not a fedfilter refusal.

    Parameters
    ----------
    reason : str or None
        An error reply's reason.

    Returns
    -------
    str or None
        The code.

    Examples
    --------
    >>> refusal_code("fedfilter[left]: budget spent"), refusal_code("Traceback ..."), refusal_code(None)
    ('left', None, None)
    """
    match = CODE_PATTERN.match(reason or "")
    return match.group(1) if match else None
