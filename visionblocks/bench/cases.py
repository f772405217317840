"""Built-in benchmark cases live in ``cases_*.py`` modules (listed in `visionblocks.bench.case.CASES`)."""
