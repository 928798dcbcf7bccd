"""``python -m ddlsim``: the command line, as launchers start it (``torchrun -m ddlsim run``)."""

import sys

from ddlsim.service.cli import main

if __name__ == "__main__":
    sys.exit(main())
