"""The ``ddlsim`` command line (and later the REST service, job worker and dashboard)."""
