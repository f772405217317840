"""``python -m visionblocks`` runs the command line."""

import sys

from visionblocks.cli import main

sys.exit(main())
