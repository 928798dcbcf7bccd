"""The store's error: a database that cannot be opened, or a row that is not in it."""

from ddlsim.data.errors import DdlsimError


class StoreError(DdlsimError, LookupError):
    """A store cannot be opened, or a row asked for (graph, strategy, job) is not in it."""
