"""Benchmarks of toolhost, run by hand (``python -m benchmarks.run``), never by pytest."""
