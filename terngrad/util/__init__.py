"""The ground floor: helpers every layer may use and that import nothing of terngrad —
atomic file writes (:mod:`~terngrad.util.files`), wall-clock timing
(:mod:`~terngrad.util.timing`) and the one renderer of differences between two settings
(:mod:`~terngrad.util.differences`)."""
