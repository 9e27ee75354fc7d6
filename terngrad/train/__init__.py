"""Training: data sets, models and the data-parallel training loop."""
