"""The exchange algorithms: the counted collectives of one process group (``link``), the
topologies that turn a flat gradient into the mean over ranks, their steps on the shared grid
or on agreed levels, and the exact traffic of each."""
