"""The work a call does, as a trace to compare between states: no timing channel on exhaustion.

``trace_of`` records every line of fedfilter's own code a call executes and every builtin call it
makes; ``lines_in`` counts the trace's lines in one file of fedfilter/.
"""

import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "fedfilter"  # the packages; paths below are relative to it
OURS = (str(ROOT) + "/",)


def trace_of(fn):
    """The work ``fn`` does, in order: every line of fedfilter's own code it executes (sys.settrace),
    and every builtin call (numpy's included) it makes (sys.setprofile).

    The garbage collector is paused: its callbacks (hypothesis installs one) run whenever a
    collection happens to fall, which is the process's business, not the state's.
    """
    events = []

    def lines(frame, event, arg):
        if event == "line":
            events.append(("line", frame.f_code.co_filename, frame.f_lineno))
        return lines

    def ours(frame, event, arg):
        return lines if frame.f_code.co_filename.startswith(OURS) else None

    def prof(frame, event, arg):
        if event == "c_call":
            events.append(("c_call", getattr(arg, "__name__", repr(type(arg)))))

    gc.collect()
    gc.disable()
    sys.setprofile(prof)
    sys.settrace(ours)
    try:
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
        gc.enable()
    return events


def lines_in(trace, path: str) -> int:
    """How many executed lines of the trace lie in ``path`` (relative to fedfilter/)."""
    return sum(1 for e in trace if e[0] == "line" and e[1] == str(ROOT / path))
