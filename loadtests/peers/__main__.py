"""``python loadtests/peers``: run the peers benchmark (see ``peers/__init__.py``)."""

import sys
from pathlib import Path

# Run as a directory, this file's folder is sys.path[0]; the package and overhead.py live one
# level up (and a module here must never shadow one of the standard library).
LOADTESTS = Path(__file__).resolve().parent.parent
sys.path[0] = str(LOADTESTS)

from peers.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
