"""The benchmark suites, one module each; run them with ``python benchmarks/run.py SUITE``."""
