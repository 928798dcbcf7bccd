"""The API's refusals: a :class:`~ddlsim.data.errors.DdlsimError` that names the request's field
and the status to answer; :func:`ddlsim.service.api.app.create_app`'s handler turns it (and the
other errors of the tools) into ``{"error", "field"}`` JSON."""

from ddlsim.data.errors import DdlsimError


class BadRequestError(DdlsimError, ValueError):
    """A request that names something that does not exist or cannot be used."""

    def __init__(self, message: str, *, field: str, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status
