"""A device's handling of one train round, as stages: admit, train, release, reply.

``individual_filter_mod`` (``client/filter_mod.py``) reads the round's placement once, at its entry
(``placement.installed_placement``), and hands it to ``run.run_round``, which calls the stages in
order:

1. ``admit.admit``: the device's settings, the request's checks (the placement's among them), the
   model and the run binding, giving one ``AdmittedRound``, or a refusal with nothing trained;
2. under the device's ledger lock (``run``): the replay check and the placement's checks against the
   ledger, then ``train.train`` (the inner handler, always run) and ``release.release_update`` (clip,
   spend durably, then noise: ``client/release.py``);
3. the placement's ``reply``.

The placement is one object: ``placement.LocalPlacement`` by default, or the SecAgg+ placement that
``secure_aggregation_mod`` alone installs around the masked stage (``client/secagg/masked_round.py``).
Everything that differs between the two lives in it: the checks before training, which arrays are
released, the mechanism, and the reply's layout.
"""
