"""``aiayn serve``: an OpenAI-compatible HTTP server (FastAPI on uvicorn) for the three families.

* :mod:`~aiayn.serve.loading`: the one function that loads the served model;
* :mod:`~aiayn.serve.lm_engine`: continuous batching for decoder-only models;
* :mod:`~aiayn.serve.seq2seq_engine`, :mod:`~aiayn.serve.encoder_engine`: requests that wait together run together;
* :mod:`~aiayn.serve.app`: the endpoints, OpenAI error objects, validation, metrics, the page at ``/``.

Needs the optional extra: ``pip install aiayn[serve]``.
"""

from aiayn.serve.errors import APIError
from aiayn.serve.loading import ServedModel, load_served_model

__all__ = ["APIError", "ServedModel", "create_app", "load_served_model"]


def create_app(*args, **kwargs):  # type: ignore[no-untyped-def]
    """See :func:`aiayn.serve.app.create_app` (imported lazily: FastAPI is an optional dependency)."""
    from aiayn.serve.app import create_app as _create_app

    return _create_app(*args, **kwargs)
