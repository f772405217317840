"""The visionblocks benchmark suite: the harness (`benchmarks.harness`) and the cases
(`benchmarks.cases`). It lives in the repository, not in the wheel; run it from a clone with
``make bench``, ``python benchmarks/run.py`` or ``visionblocks bench``.
"""
