"""The front doors: the DDP communication hook (a ``(state, hook)`` pair) and the
``Synchronizer`` for training loops without DDP."""
