import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("CAPSIM_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture
def shared_data():
    if not SHARED_DATA.exists():
        pytest.skip(f"public data folder {SHARED_DATA} not present (set CAPSIM_SHARED_DATA)")
    return SHARED_DATA
