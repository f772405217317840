"""A module that costs 150 MiB of resident memory to import (a stand-in for a peer library).

Imported lazily by a benchmark case of ``tests/bench/test_harness.py``: the measured peak
memory of that case's call must not include it.
"""

import torch

IMPORT_MIB = 150
BALLAST = torch.ones(IMPORT_MIB * 1024 * 1024 // 4)  # written, so resident
