"""A way for whoever runs a long measurement to stop it between two steps.

The service's worker sets :data:`CHECK` for the duration of a task to a function that raises
when the task is cancelled, has run past its deadline or the worker is stopping; the loops
that can run long (kernel profiling's iterations, waiting for a launch's ranks) call
:func:`check` each step. Unset (the command line), it does nothing.
"""

import contextvars
from collections.abc import Callable

CHECK: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "ddlsim_interrupt_check", default=None
)


def check() -> None:
    """Raise what the installed check raises, if any (called between steps)."""
    installed = CHECK.get()
    if installed is not None:
        installed()
