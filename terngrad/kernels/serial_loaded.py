"""Importing this module loads the serial build of the numba kernels into the importer
(:func:`terngrad.kernels.warm_up` with one thread: from numba's cache, about half a second;
compiled if not cached yet), so that every process forked from it has them: a fork server
preloads it (``multiprocessing.set_forkserver_preload``) for workers of one thread each, which
then start without loading them each. The parallel build is left alone: running it starts
numba's threads, which a fork does not carry over.
"""

from terngrad.kernels import warm_up

warm_up(levels=True, threads=1)
