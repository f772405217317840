"""Command-line pieces shared by the examples (imports only argparse, so --help stays instant).

The examples run as scripts (``python examples/NAME.py``), so this folder is on ``sys.path``
and ``from _args import example_parser, positive_int`` finds this file.
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every option's default and keeps the description's paragraphs.

    A ``None`` default is not shown: the option's own help says what happens without it.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1.

    Example:
        >>> positive_int("3")
        3
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def example_parser(doc: str | None, epilog: str) -> argparse.ArgumentParser:
    """The parser of one example: its docstring as description, defaults shown, an epilog."""
    return argparse.ArgumentParser(description=doc, epilog=epilog, formatter_class=HelpFormatter)
