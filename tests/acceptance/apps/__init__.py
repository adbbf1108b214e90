"""Handler modules that the acceptance tests' worker subprocesses load with `--app`."""
