import os
import tempfile

# Ray (Flower's simulation backend) must listen on 127.0.0.1 only; set before anything imports it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# The devices of every test keep their owner's state (roll-back anchors: client/ledger/anchor.py) in
# one directory of this session, never in the user's ~/.local/state. Set once, at import, so that
# module-scoped fixtures and child processes (SuperNodes, Ray workers) see the same one; anchors are
# kept per ledger directory, so tests do not share any.
os.environ["FEDFILTER_STATE_DIR"] = tempfile.mkdtemp(prefix="fedfilter-owner-state-")


def pytest_collection_modifyitems(config, items):
    """Tests that start Flower engines (marked slow) run first, in their usual order: on two workers
    (pytest-xdist hands out tests in this order) the longest ones start early and the short ones fill
    in at the end, so one worker does not finish a long test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
