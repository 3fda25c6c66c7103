"""The error of the device's settings, apart from the modules that raise it (the settings file and the
ledger root both raise it, and neither imports the other)."""

from __future__ import annotations


class DeviceSettingsError(ValueError):
    """The device-settings file is missing, unreadable, or has no valid entry for this node.

    ``str(err)`` is the whole story (for the device's log); ``err.public`` is what the error reply
    may say: the file, the partition-id, the key, and the value unless it is in ``WITHHELD_KEYS``.
    """

    def __init__(self, detail: str, public: str | None = None):
        super().__init__(detail)
        self.public = detail if public is None else public
