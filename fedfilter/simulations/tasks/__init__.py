"""Built-in tasks: data loaders, client partitions, small models, training.

Kept free of imports so that ``fedfilter.simulations.tasks.training`` loads only numpy
and torch in the Flower ClientApp's fresh processes.
"""
