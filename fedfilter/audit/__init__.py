"""``fedfilter audit``: the privacy guarantee, measured by canary devices through the real mod.

``bounds`` (pure lower-bound math), ``game`` (canary devices and the attacker's score),
``distinguishers`` (exhaustion: bits, time, bytes), ``run`` (``run_audit``), ``report`` (table, plot).
"""
