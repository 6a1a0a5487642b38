"""stormguard benchmarks: ``python -m bench [NAME ...]`` (or ``make bench``)."""
