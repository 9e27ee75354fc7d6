"""The ground floor: helpers every layer may use and that import nothing of terngrad —
atomic file writes (:mod:`~terngrad.util.files`), wall-clock timing
(:mod:`~terngrad.util.timing`), the one renderer of differences between two settings
(:mod:`~terngrad.util.differences`), an interface's counters (:mod:`~terngrad.util.netdev`) and
settings that carry their own help and range (:mod:`~terngrad.util.settings`)."""
