"""Preflight diagnostics, one module per family of checks in data-flow order (data_checks, model_checks,
training_checks), run and reported by suite."""
