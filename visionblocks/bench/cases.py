"""Built-in benchmark cases: none yet; later issues add them here and in ``cases_*.py`` modules."""
