from __future__ import annotations

from pathlib import Path

import pytest

from tests.h2.support import Certs, make_certs


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    """A test CA of the test's own and the gateway's certificate it signed (trustme)."""
    return make_certs(tmp_path / "tls")
