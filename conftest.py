"""What every pytest run in this repository needs, the doctests of fedfilter/ included (tests/conftest.py
applies to tests/ only): devices enrolled by an example keep their owner's state (roll-back anchors) in
a directory of this session, never in the user's ~/.local/state."""

import os
import tempfile

os.environ.setdefault("FEDFILTER_STATE_DIR", tempfile.mkdtemp(prefix="fedfilter-owner-state-"))
