"""The demo's population part: thousands of devices with budgets of at most epsilon 8 that learn.

``fedfilter demo --population N`` runs it (``fedfilter.cli.demo_population`` prints and plots it):
a federation of ``N`` devices on the vectorised engine (``fedfilter.simulations.engine``, the
privacy code a Flower device runs, applied to every device at once) with distributed noise over
simulated SecAgg+, the noise multiplier from ``fedfilter.planning`` (``settings.plan_population``),
against the same federation without privacy (``no_privacy``).

Modules: ``settings`` (``PopulationSettings``, ``plan_population``, ``planned_noise_multiplier``;
no torch, so the command line imports it at start-up), ``run`` (``run_population`` ->
``PopulationRun``) and ``no_privacy`` (``no_privacy_accuracy``).
"""
