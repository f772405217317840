"""The package version (one place: the root package, the CLI and the data files read it)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
"""The version of visionblocks, ``"MAJOR.MINOR.PATCH"``: the package metadata
(``pip show visionblocks``) and ``visionblocks --version`` report the same string."""
