"""The error of the device's settings, apart from the modules that raise it (the settings file and the
ledger root both raise it, and neither imports the other)."""

from __future__ import annotations


class DeviceSettingsError(ValueError):
    """The device-settings file is missing, unreadable, or has no valid entry for this node.

    ``str(err)`` is the whole story (for the device's log); ``err.public`` is what the error reply
    may say: the file, the partition-id, the key, and the value unless it is in ``WITHHELD_KEYS``.

    Parameters
    ----------
    detail : str
        The whole message.
    public : str, optional
        What the reply may say (default: ``detail``).

    Examples
    --------
    >>> err = DeviceSettingsError("no entry for partition-id 3 in /secret/path", "no entry for partition-id 3")
    >>> str(err), err.public
    ('no entry for partition-id 3 in /secret/path', 'no entry for partition-id 3')
    """

    def __init__(self, detail: str, public: str | None = None):
        super().__init__(detail)
        self.public = detail if public is None else public
