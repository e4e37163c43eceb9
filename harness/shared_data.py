"""Where the real length samples live: ``../shared/data`` beside the project's root.

The files are read in place and never copied into the repository. ``HARNESS_DATA_DIR``
overrides the location (e.g. for an installed package or a different checkout layout).
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """The folder holding ``lmsys_sample_lengths.csv`` and friends (may not exist)."""
    env = os.environ.get("HARNESS_DATA_DIR")
    if env is not None:
        return Path(env)
    return (_REPO_ROOT.parent / "shared" / "data").resolve()
