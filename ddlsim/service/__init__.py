"""The ``ddlsim`` command line, the REST service, its job worker and the dashboard."""
