"""The drain: the background thread that turns records into metrics and span descriptions (policy, no I/O)."""
