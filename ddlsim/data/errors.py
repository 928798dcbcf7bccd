"""The exception hierarchy: one root, subclasses that also derive the builtin they resemble.

Every message names the bad value and what is allowed, so the command line can print it as one
line and exit with status 2.
"""


class DdlsimError(Exception):
    """Root of every error ddlsim raises on purpose."""


class InvalidModelSpecError(DdlsimError, ValueError):
    """A model spec names an unknown class, a bad config key or impossible inputs."""


class UnknownModelError(InvalidModelSpecError):
    """A model name is neither in the zoo nor a readable spec file nor inline JSON."""


class InvalidClusterError(DdlsimError, ValueError):
    """A cluster spec is inconsistent (world size, link rates, backend for the device)."""


class InvalidStrategyError(DdlsimError, ValueError):
    """A strategy cannot be applied: bad parallel plan, buckets that miss or repeat a gradient."""


class InvalidOptionError(DdlsimError, ValueError):
    """An option of a command or API call is outside its allowed values."""


class InvalidGraphError(DdlsimError, ValueError):
    """A serialized iteration graph is malformed or from an unsupported schema version."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (multi-line messages joined), at most ``limit`` chars."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    text = text or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
