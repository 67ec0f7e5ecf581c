"""The ``choices`` of a completion (or translation) body from the engine's results: whole or as
stream chunks, with ``n`` and ``best_of`` (the ``n`` samples of best log-probability per token),
``echo`` (the prompt first) and ``logprobs`` (OpenAI's legacy shape)."""

from __future__ import annotations

from typing import Any

from aiayn.serve.lm_engine import Completion
from aiayn.serve.loading import ServedModel
from aiayn.serve.logprobs import TokenLogprobs, legacy_logprobs

__all__ = ["Choices", "PlainChoices"]


def choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs, **extra}


class PlainChoices:
    """One choice per result, text only (translations)."""

    def whole(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [choice(i, r["text"], r["finish_reason"]) for i, r in enumerate(results)]

    def piece(self, index: int, text: str, scores: TokenLogprobs | None = None, offset: int = 0) -> dict[str, Any]:
        return choice(index, text, None)

    def last(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        return choice(index, "", result["finish_reason"])

    def usage(self, results: list[dict[str, Any]]) -> dict[str, int]:
        prompt = sum(r["prompt_tokens"] for r in results)
        return self._usage(prompt, results)

    @staticmethod
    def _usage(prompt: int, results: list[dict[str, Any]]) -> dict[str, int]:
        completion = sum(r["completion_tokens"] for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Choices(PlainChoices):
    """Completion choices: result ``p * best_of + j`` is sample ``j`` of prompt ``p``; choice ``p * n + i``
    is the ``i``-th best of them (all of them, in order, when ``best_of == n``)."""

    def __init__(self, served: ServedModel, request: Completion, as_ids: bool) -> None:
        self.request, self.as_ids = request, as_ids
        self.decode = served.tgt_tokenizer.decode

    def whole(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        request, out = self.request, []
        for p in range(len(request.prompts)):
            samples = list(range(p * request.best_of, (p + 1) * request.best_of))
            if request.best_of > request.n:
                samples.sort(key=lambda r: -_per_token(results[r]["scores"]))
            for i, row in enumerate(samples[: request.n]):
                out.append(self._choice(p * request.n + i, results[row]))
        return out

    def _choice(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        echo: TokenLogprobs | None = result["echo"]
        prefix = self.decode(echo.ids) if echo is not None else ""
        scores = (echo + result["scores"]) if echo is not None else result["scores"]
        logprobs = legacy_logprobs(scores, self.decode, as_ids=self.as_ids) if self.request.logprobs is not None else None
        return choice(index, prefix + result["text"], result["finish_reason"], logprobs, window_slid=result["window_slid"])

    def piece(self, index: int, text: str, scores: TokenLogprobs | None = None, offset: int = 0) -> dict[str, Any]:
        """A stream chunk: the new text (the prompt first, with echo) and its tokens' logprobs."""
        logprobs = None
        if self.request.logprobs is not None:
            logprobs = legacy_logprobs(scores or TokenLogprobs(), self.decode, offset=offset, as_ids=self.as_ids)
        return choice(index, text, None, logprobs)

    def last(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        return choice(index, "", result["finish_reason"], window_slid=result["window_slid"])

    def usage(self, results: list[dict[str, Any]]) -> dict[str, int]:
        return self._usage(sum(len(p) for p in self.request.prompts), results)


def _per_token(scores: TokenLogprobs) -> float:
    return scores.total() / max(len(scores), 1)
