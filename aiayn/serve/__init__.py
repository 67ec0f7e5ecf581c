"""``aiayn serve``: an OpenAI-compatible HTTP server (FastAPI on uvicorn) for the three families.

* :mod:`~aiayn.serve.loading`: the one function that loads the served model;
* :mod:`~aiayn.serve.lm_engine` (+ :mod:`~aiayn.serve.batch_state`): continuous batching for decoder-only models;
* :mod:`~aiayn.serve.seq2seq_engine`, :mod:`~aiayn.serve.encoder_engine`: requests that wait together run together;
* :mod:`~aiayn.serve.app`: ``create_app``, the endpoints, OpenAI error objects, validation, metrics, the page at ``/``.

The app needs the optional extra (``pip install aiayn[serve]``); this package imports without it.
"""

from aiayn.serve.errors import APIError
from aiayn.serve.loading import ServedModel, load_served_model

__all__ = ["APIError", "ServedModel", "load_served_model"]
