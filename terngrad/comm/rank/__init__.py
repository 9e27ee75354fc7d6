"""One rank's running state: the options made concrete, error feedback and the exchanged
momentum, bucket plans, the full-precision all-reduce, the auto policy, counters, what the
ranks must agree on, saved states and their checks, and the ``Reducer`` that runs a step's
exchanges on all of it."""
