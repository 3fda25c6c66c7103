import os

# Ray (Flower's simulation backend) must listen on 127.0.0.1 only; set before anything imports it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
