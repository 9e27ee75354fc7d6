"""The one error every data loader raises for a data set that is not on disk."""


class DataMissing(Exception):
    """A data set is not where it was looked for; the message (one line) says how to get it."""
