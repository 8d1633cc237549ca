"""Exactly-once elastic sampling and real data sets."""
