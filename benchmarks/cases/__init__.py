"""Built-in benchmark cases, one module per topic (listed in `benchmarks.harness.case.CASES`)."""
