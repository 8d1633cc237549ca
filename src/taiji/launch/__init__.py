"""Processes: the `taiji` command and the supervisor of local workers."""
