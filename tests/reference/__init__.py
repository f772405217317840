"""Plain, readable reference formulations of every op: the oracles of the tests."""
