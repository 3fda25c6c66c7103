"""A mod that acts at most once per message, however often it is listed around a ClientApp.

The device runtime (``client/runtime/app.py``) puts the device's own mods outermost around every
approved app; an app may list the same mods itself. Filtering twice would spend twice and add noise
twice, so an inner copy of a mod that is already running further out passes the message on untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar

from flwr.app import Context, Message

Handler = Callable[[Message, Context], Message]
Mod = Callable[[Message, Context, Handler], Message]


def once_per_message(mod: Mod) -> Mod:
    """``mod`` acts only in its outermost position; nested copies call the next handler directly.

    Parameters
    ----------
    mod : callable
        A Flower mod ``(msg, context, call_next) -> Message``.

    Returns
    -------
    callable
        The same mod, passing the message on untouched when a copy of it is already running.

    Examples
    --------
    >>> calls = []
    >>> def counting(msg, context, call_next):
    ...     calls.append(msg)
    ...     return call_next(msg, context)
    >>> once = once_per_message(counting)
    >>> once("msg", None, lambda m, c: once(m, c, lambda m2, c2: m2))  # listed twice
    'msg'
    >>> len(calls)
    1
    """
    active: ContextVar[bool] = ContextVar(f"fedfilter.once.{mod.__qualname__}", default=False)

    @functools.wraps(mod)
    def wrapper(msg: Message, context: Context, call_next: Handler) -> Message:
        if active.get():
            return call_next(msg, context)
        token = active.set(True)
        try:
            return mod(msg, context, call_next)
        finally:
            active.reset(token)

    return wrapper
