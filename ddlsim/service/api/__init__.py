"""The REST API (FastAPI): the zoo, graphs, predictions, and the jobs the workers run.

Everything under ``/v1``. Reads are open; every mutating request (POST, DELETE) needs the
bearer token (``Authorization: Bearer TOKEN``). Predictions and graphs are answered at once;
strategy requests (searches), profiling runs and executions become tasks in the store's queue
(:mod:`data.store.tasks`) that a worker (:mod:`service.worker`) runs, reporting progress; their
``GET`` gives status, progress and, once done, the result.

Model specs are data: a request names a zoo or registered model, or gives a spec object; a
string is never read as a path. Bodies over ``max_body_bytes`` are refused (413). Bad input gets
a 4xx whose JSON ``error`` names the field; nothing here answers 5xx on purpose.

The app and its settings are in :mod:`.app`, the routes' dependencies in :mod:`.deps`, request
and response schemas in :mod:`.schemas`, one router a resource in :mod:`.routes`.
"""

from ddlsim.service.api.app import Settings, create_app

__all__ = ["Settings", "create_app"]
