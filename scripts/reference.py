"""Write the manual's generated reference pages (docs/reference/): the command line, the REST
API and the spec JSON, from the code. ``--check`` only says which are stale (exit 1)."""

import argparse
import sys
from pathlib import Path

from ddlsim.service.reference import stale, write

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only list the stale pages")
    args = parser.parse_args()
    pages = stale(ROOT) if args.check else write(ROOT)
    for page in pages:
        print(("stale: " if args.check else "wrote: ") + page)
    return 1 if args.check and pages else 0


if __name__ == "__main__":
    sys.exit(main())
