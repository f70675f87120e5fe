"""Framework-free core of the probes: configuration, errors, metrics and thresholds."""
