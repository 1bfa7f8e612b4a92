"""The benchmarks' harness, shared by every suite of ``benchmarks/suites/`` (see the README)."""
