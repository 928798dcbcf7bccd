"""``python -m ddlsim``: the command line, as launchers start it (``torchrun -m ddlsim run``)."""

from ddlsim.service.cli import run_command_line

if __name__ == "__main__":
    run_command_line()
