"""A 12-client, 4-round dropout study shared by the study and benchmark tests (seconds to run)."""

TINY_STUDY = """
[study]
name = "tiny"
rounds = 4
seeds = [0]
delta = 1e-5
filter = "rdp"      # distributed (Skellam) noise is accounted by the rdp filter
budget_grid = 0     # budgets exactly as drawn

[federation]
noise_multiplier = 1.0
clip = 1.0
fraction = 1.0
min_reports = 2
worst_case_factor = 2.0
# Distributed: snapping toward zero leaves a nearly spent client a sliver of allowance that drains
# slowly (its charge is at the snapped integer norm); out below 2% of the clip, in both placements.
exhausted_below = 0.02
local_epochs = 1
lr = 0.5
noise_draw = "aggregate"

[sweep]
budget_level = [0.5]
heterogeneity = ["two"]
after_exhaustion = ["noise-only", "leave"]
noise = ["distributed"]
data = ["d"]

[heterogeneity.two]
distribution = "two-level"   # most clients run out after a round or two, a few (x 40) keep going
low = 1.0
high = 40.0
share_high = 0.25

[data.d]
task = "digits"
partition = "dirichlet"
alpha = 0.5
num_clients = 12
"""
