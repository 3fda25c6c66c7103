"""fedfilter: individual, lifelong privacy filters for the clients of a Flower federation."""

__version__ = "0.1.0"
