"""tests/report shares the planted family and its real sweep runs with tests/sweeps."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sweeps"))
