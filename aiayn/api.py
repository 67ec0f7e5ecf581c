"""``aiayn.load(path)``: a trained or pretrained model, ready to use in one line.

>>> m = aiayn.load("runs/multi30k-de-en/averaged")       # doctest: +SKIP
>>> m.translate(["Ein Hund läuft."])                       # doctest: +SKIP
['A dog is running.']

``path`` is one of our model directories, a training checkpoint or run directory, or a Hugging Face
model directory (GPT-2, GPT-NeoX, BERT, RoBERTa-PreLN, Marian, BART, mBART: imported in memory, with its own tokenizer). The methods
are thin calls into :mod:`aiayn.decoding.text`, the same path the CLI takes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import torch
from torch import nn

from aiayn.checkpoint.directory import CONFIG_FILE
from aiayn.decoding.adapters import CausalLMDecoder
from aiayn.decoding.generation import generate as run_generation
from aiayn.decoding.protocol import left_pad
from aiayn.decoding.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeDecoder
from aiayn.decoding.text import (
    FilledMask,
    beam_config,
    classify_texts,
    fill_mask_text,
    generation_config,
    pad_id,
    prompt_ids,
    score_texts,
)
from aiayn.decoding.translate import translate_sentences
from aiayn.inference.embed import embed_texts, embedding_pooling
from aiayn.inference.precision import parse_kv_dtype
from aiayn.models.config import TransformerConfig
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.models.encoder_only import EncoderOnly
from aiayn.nn.cache import KV_AUTO
from aiayn.pretrained import Pretrained, id2label_names, load_pretrained, prepare_for_inference
from aiayn.tokenization.base import Tokenizer, same_vocabulary
from aiayn.tokenization.special import SpecialIds, special_ids
from aiayn.training.config import DecodeSection
from aiayn.untrusted import read_json_file

__all__ = ["load", "load_parts", "LoadedModel", "Prediction", "is_hf_dir"]


@dataclass(frozen=True)
class Prediction:
    """A classification: the best ``label`` (its name, or its index as text), its ``prob``, and every class's."""

    label: str
    prob: float
    probs: dict[str, float]


class LoadedModel:
    """A model in eval mode with its tokenizer(s). ``family``: ``"encoder-decoder"``, ``"decoder-only"``
    or ``"encoder-only"``; a method of another family raises ``ValueError`` naming the family it needs."""

    def __init__(
        self, model: nn.Module, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, *, path: Path,
        labels: list[str] | None = None, decode: DecodeSection | None = None,
    ) -> None:
        self.model = model
        self.config: TransformerConfig = model.config  # type: ignore[assignment]
        self.src_tokenizer, self.tgt_tokenizer, self.path, self.labels = src_tokenizer, tgt_tokenizer, path, labels
        self.decode = decode or DecodeSection()  # the beam search its recipe chose on val, else the paper's

    @property
    def family(self) -> str:
        return self.config.family

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer that reads input text (the source side for translation)."""
        return self.src_tokenizer

    @property
    def special_ids(self) -> SpecialIds:
        return special_ids(self.src_tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def translate(
        self, texts: str | Sequence[str], beam_size: int | None = None, *, length_penalty: float | None = None,
        max_new_tokens: int | None = None, batch_size: int = 16,
    ) -> list[str]:
        """Translate each text with beam search; ``beam_size`` and ``length_penalty`` default to the model's
        ``decode`` settings (its recipe's, else the paper's beam 4 and alpha 0.6, section 6.1)."""
        model = self._need(EncoderDecoder, "translate")
        texts = _as_list(texts, "texts")
        config = beam_config(self.tgt_tokenizer, **self.decode.beam(beam_size, length_penalty), max_new_tokens=max_new_tokens)
        results = translate_sentences([model], self.src_tokenizer, texts, config, tgt_tokenizer=self.tgt_tokenizer, batch_size=batch_size)
        return [self.tgt_tokenizer.decode(hyps[0].tokens) if hyps else "" for hyps in results]

    @overload
    def generate(  # type: ignore[overload-overlap]  # a str is a Sequence[str] too: the first match wins
        self, prompt: str, max_new_tokens: int = 50, temperature: float = 1.0, top_k: int | None = None,
        top_p: float | None = None, seed: int = 0, *, greedy: bool = False, stop: Sequence[str] = (),
        repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
        min_p: float | None = None, speculative: str | None = None, draft: LoadedModel | None = None,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS, kv_dtype: str | torch.dtype | None = KV_AUTO,
    ) -> str: ...

    @overload
    def generate(
        self, prompt: Sequence[str], max_new_tokens: int = 50, temperature: float = 1.0, top_k: int | None = None,
        top_p: float | None = None, seed: int = 0, *, greedy: bool = False, stop: Sequence[str] = (),
        repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
        min_p: float | None = None, speculative: str | None = None, draft: LoadedModel | None = None,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS, kv_dtype: str | torch.dtype | None = KV_AUTO,
    ) -> list[str]: ...

    def generate(
        self, prompt: str | Sequence[str], max_new_tokens: int = 50, temperature: float = 1.0, top_k: int | None = None,
        top_p: float | None = None, seed: int = 0, *, greedy: bool = False, stop: Sequence[str] = (),
        repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
        min_p: float | None = None, speculative: str | None = None, draft: LoadedModel | None = None,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS, kv_dtype: str | torch.dtype | None = KV_AUTO,
    ) -> str | list[str]:
        """Continue ``prompt`` (one text, or a list decoded as one left-padded batch); returns each prompt
        followed by its generated text (EOS not shown): a ``str`` for a ``str``, a list for a list.

        ``presence_penalty``, ``frequency_penalty`` (OpenAI's, in [-2, 2]) and ``min_p``: the logits processors the
        CLI and the server use (:mod:`aiayn.decoding.processors`).
        ``speculative``: ``"prompt-lookup"`` or ``"draft"`` (with ``draft``, a smaller loaded model of the same
        tokenizer) checks up to ``draft_tokens`` drafted tokens per forward (:mod:`aiayn.decoding.speculative`);
        greedy output is the same, sampling the same distribution. A list is then decoded prompt by prompt.
        ``kv_dtype``: the dtype the static cache keeps keys and values in (``"bfloat16"`` halves what each step reads
        from it under fp32 activations; ``None``: the activations'; default ``"auto"``: bf16 for weight-only int8 and int4 weights
        under fp32 activations, else the activations', :func:`~aiayn.decoding.adapters.auto_kv_dtype`)."""
        model = self._need(DecoderOnly, "generate")
        tok = self.src_tokenizer
        config = generation_config(
            tok, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
            stop_strings=tuple(stop), repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, min_p=min_p,
        )
        prompts = _as_list(prompt, "prompt")
        if not prompts:
            raise ValueError("prompt is an empty list: give at least one text")
        prompt_rows = [prompt_ids(tok, p) for p in prompts]
        generator = torch.Generator(device=self.device).manual_seed(seed)
        decoder = CausalLMDecoder(model, static_cache=True, kv_dtype=parse_kv_dtype(kv_dtype))  # the CLI's decoder
        if speculative is not None:
            rows = self._speculative_rows(decoder, prompt_rows, config, generator, speculative, draft, draft_tokens)
        else:
            ids, mask = left_pad(prompt_rows, pad_id(tok), self.device)
            rows = run_generation(decoder, ids, mask, config, generator=generator, detokenize=tok.decode).sequences()
        texts = [p + tok.decode(row) for p, row in zip(prompts, rows)]
        return texts[0] if isinstance(prompt, str) else texts

    def _speculative_rows(
        self, decoder: CausalLMDecoder, prompts: list[list[int]], config: Any, generator: torch.Generator, mode: str,
        draft: LoadedModel | None, draft_tokens: int,
    ) -> list[list[int]]:
        """Each prompt's (ids') generated ids, decoded one by one speculatively (speculative decoding takes one row)."""
        if draft is not None and not isinstance(draft, LoadedModel):
            raise ValueError(f"draft must be an aiayn.load(...) model, got {type(draft).__name__}")
        if draft is not None and not same_vocabulary(draft.src_tokenizer, self.src_tokenizer):
            raise ValueError(f"draft={draft.path} has another tokenizer than {self.path}: a draft model must share the "
                             "model's tokenizer (same vocabulary and special ids), or use speculative='prompt-lookup'")
        speculative = SpeculativeDecoder(decoder, mode=mode, draft_tokens=draft_tokens, draft_model=None if draft is None else draft.model)
        tok = self.src_tokenizer
        rows = []
        for prompt in prompts:
            ids = torch.tensor([prompt], device=self.device)
            rows.extend(run_generation(speculative, ids, None, config, generator=generator, detokenize=tok.decode).sequences())
        return rows

    def classify(self, texts: str | Sequence[str], *, batch_size: int = 32) -> list[Prediction]:
        """The class of each text, by name where the checkpoint knows the names (else ``"0"``, ``"1"``...)."""
        model = self._need(EncoderOnly, "classify")
        texts = _as_list(texts, "texts")
        result = classify_texts(model, self.src_tokenizer, texts, batch_size=batch_size, device=self.device)
        names = self.labels or [str(i) for i in range(result.probs.shape[1])]
        return [
            Prediction(names[label], row[label], dict(zip(names, row)))
            for label, row in zip(result.labels.tolist(), result.probs.tolist())
        ]

    def embed(
        self, texts: str | Sequence[str], *, normalize: bool | None = None, batch_size: int = 32, pooling: str | None = None,
    ) -> torch.Tensor:
        """Sentence embeddings ``(N, d_model)``, float32, as sentence-transformers' ``encode`` gives them.

        The pooling is read from sentence-transformers' files in the model's directory where they exist
        (``modules.json``: mean, cls or max, and whether a ``Normalize`` module follows); other models
        pool with the mean and normalise. ``pooling`` (``"mean"``, ``"cls"``, ``"max"``) and ``normalize``
        override that. Texts longer than the model's limit are cut, as sentence-transformers cuts them.
        """
        model = self._need(EncoderOnly, "embed")
        chosen = embedding_pooling(model, self.path, pooling=pooling, normalize=normalize)
        return embed_texts(model, self.src_tokenizer, _as_list(texts, "texts"), chosen, batch_size=batch_size, device=self.device)

    def fill_mask(self, text: str, top_k: int = 5) -> FilledMask:
        """Fill each mask token of ``text`` (the tokenizer's spelling: ``<mask>``, BERT's ``[MASK]``)."""
        model = self._need(EncoderOnly, "fill_mask")
        return fill_mask_text(model, self.src_tokenizer, text, top_k=top_k, device=self.device)

    def score(self, texts: str | Sequence[str], targets: Sequence[str] | None = None) -> list[float]:
        """Log-probability of each text (encoder-decoder: of each target given its source text);
        see :func:`aiayn.decoding.text.score_texts`."""
        return score_texts(self.model, self.src_tokenizer, self.tgt_tokenizer, _as_list(texts, "texts"), targets, device=self.device)

    def _need(self, family: type[nn.Module], method: str) -> Any:
        if not isinstance(self.model, family):
            needs = {EncoderDecoder: "encoder-decoder", DecoderOnly: "decoder-only", EncoderOnly: "encoder-only"}[family]
            raise ValueError(f"{method}() needs an {needs} model; {self.path} holds a {self.family} model")
        return self.model

    def __repr__(self) -> str:
        return f"LoadedModel(family={self.family!r}, path={str(self.path)!r}, tokenizer={self.src_tokenizer!r})"


def load(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    quantize: str | None = None,
    pack: bool = True,
) -> LoadedModel:
    """Load a model directory (ours or Hugging Face's), a checkpoint or a run directory, with its tokenizer.

    ``dtype`` (``torch.bfloat16`` or ``"bfloat16"``), ``quantize`` (``"int8"``: weight-only, per-channel
    scales; ``"int8-dynamic"``: the same weights, activations quantised to 8 bits at each call; ``"int4"``,
    ``"int4-g64"``, ``"int4-g128"``: 4-bit weights in groups) and ``device`` (``"cuda"``) are applied once, at load; ``pack=False`` holds each Linear weight once
    (less memory, slower few-row matmuls on the CPU: :func:`~aiayn.pretrained.load_pretrained`).
    Raises ``FileNotFoundError`` naming the path, ``ValueError`` for a directory without a tokenizer or
    whose tokenizer does not fit the model.
    """
    loaded = load_parts(path, device=device or "cpu", dtype=dtype, quantize=quantize, pack=pack)
    if loaded.src_tokenizer is None or loaded.tgt_tokenizer is None:
        raise ValueError(f"{path}: no tokenizer, so text cannot be encoded ({loaded.path} holds no tokenizer file)")
    return LoadedModel(loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer, path=loaded.path, labels=loaded.labels,
                       decode=loaded.decode)


def load_parts(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    pack: bool = True,
) -> Pretrained:
    """The model, config, tokenizers and class names of ``path`` (ours, a checkpoint, a run, or a
    Hugging Face directory imported in memory), in the precision asked for. The CLI's loader too."""
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"no model at {directory}: no such file or directory")
    if is_hf_dir(directory):
        from aiayn.interop.hf import load_hf  # interop only when a Hugging Face directory is given

        imported = load_hf(directory)
        labels = id2label_names(imported.hf_config)
        model = prepare_for_inference(imported.model, device=device, dtype=dtype, quantize=quantize, pack=pack)
        return Pretrained(model, imported.config, imported.tokenizer, imported.tgt_tokenizer, directory, labels)
    return load_pretrained(directory, device=device, dtype=dtype, quantize=quantize, pack=pack)



def is_hf_dir(directory: Path) -> bool:
    """A Hugging Face model directory: its config.json names ``architectures`` (ours names a ``family``)."""
    file = directory / CONFIG_FILE
    if not file.is_file():
        return False
    try:
        config = read_json_file(file, what="model config")  # bounded: a hostile file is named by the loader
    except ValueError:
        return False
    return isinstance(config, dict) and "family" not in config and ("architectures" in config or "model_type" in config)


def _as_list(texts: str | Sequence[str], name: str) -> list[str]:
    if isinstance(texts, str):
        return [texts]
    if not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a str or a list of str, got {type(texts).__name__}")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(text).__name__}")
    return texts
