"""``aiayn serve``: an OpenAI-compatible HTTP server (FastAPI on uvicorn) for the three families.

* :mod:`~aiayn.serve.loading`: the one function that loads the served model;
* :mod:`~aiayn.serve.lm_engine` (+ :mod:`~aiayn.serve.batch_state`): continuous batching for decoder-only models;
* :mod:`~aiayn.serve.seq2seq_engine`, :mod:`~aiayn.serve.encoder_engine`: requests that wait together run together;
* :mod:`~aiayn.serve.app`: ``create_app``, the endpoints, OpenAI error objects, validation, metrics, the page at ``/``.
* :mod:`~aiayn.serve.requests`: a body -> an engine's work item (a completion's ``GenerationConfig``);
  :mod:`~aiayn.serve.choices` and :mod:`~aiayn.serve.logprobs`: results -> OpenAI's ``choices``;
  :mod:`~aiayn.serve.capabilities`: which endpoints the model serves, and its card in ``/v1/models``.

The app needs the optional extra (``pip install aiayn[serve]``); this package imports without it.
"""

from aiayn.serve.errors import APIError
from aiayn.serve.loading import ServedModel, load_served_model

__all__ = ["APIError", "ServedModel", "load_served_model"]
