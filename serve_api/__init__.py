"""The parts of the HTTP admission face (assembled by :mod:`serve_app`): types (:mod:`serve_api.views`),
the input boundary (:mod:`serve_api.boundary`), the scheduler client (:mod:`serve_api.client`), the
replica's snapshot copy (:mod:`serve_api.snapshot`) and the routes, one ``APIRouter`` per concern
(:mod:`serve_api.jobs`: jobs and groups)."""
