"""The fault suite starts runs with the end-to-end helpers of tests/system."""

from __future__ import annotations

import sys
from pathlib import Path

# pytest puts each test's own folder on the path; the shared helpers live in a sibling one.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "system"))
