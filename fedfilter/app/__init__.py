"""The built-in Flower app (Flower's template: ``client_app.py``, ``server_app.py``, ``task.py``).

This folder is a Flower app directory (its ``pyproject.toml`` names the components and the run
config), so ``flwr run`` can take it as it is; the code it runs is the installed ``fedfilter``.
Its ``[tool.flwr.app.config]`` is the one place of the app's defaults (``fedfilter.app.config``).
"""
