"""The method spec: the exchange's ``Options``, the ``Method`` that names a whole way to
average gradients by one rule, and the table of methods (what a run is, before any rank talks)."""
