"""Decoding strategies, outside the model classes, for any model that meets the small
:class:`~aiayn.decoding.protocol.Decoder` protocol (both generative families have an adapter).

* greedy and sampling: :func:`generate` / :func:`generate_steps` with a :class:`GenerationConfig`
  (:func:`greedy` is the shortcut); beam search: :func:`beam_search` with a :class:`BeamConfig`;
* streaming: :func:`generate_steps` (iterator), ``generate(on_step=...)`` (callback), :func:`stream_text`;
* encoder-only: :func:`fill_mask`, :func:`classify`;
* ensembles: :class:`EnsembleDecoder` averages several decoders' probabilities, for any strategy;
* speculative decoding: :class:`SpeculativeDecoder` (prompt lookup or a draft model), for greedy and sampling.
"""

from aiayn.decoding.adapters import CausalLMDecoder, Seq2SeqDecoder, as_decoder
from aiayn.decoding.beam import BeamConfig, Hypothesis, beam_search, length_penalty
from aiayn.decoding.encoder_only import (
    Classification,
    MaskPrediction,
    classify,
    encode_masked_text,
    encode_sentences,
    fill_mask,
)
from aiayn.decoding.ensemble import EnsembleDecoder
from aiayn.decoding.generation import Generation, GenerationStep, generate, generate_steps
from aiayn.decoding.greedy import greedy
from aiayn.decoding.protocol import SOURCE_EXTRA_TOKENS, Decoder, DecodeState, left_pad, right_pad
from aiayn.decoding.sampling import GenerationConfig, logits_to_probs, next_token, sample
from aiayn.decoding.speculative import SpeculativeDecoder
from aiayn.decoding.streaming import TextStreamer, stream_text

__all__ = [
    "Decoder", "DecodeState", "Seq2SeqDecoder", "CausalLMDecoder", "as_decoder", "left_pad", "right_pad",
    "SOURCE_EXTRA_TOKENS", "GenerationConfig", "Generation", "GenerationStep", "generate", "generate_steps",
    "greedy", "logits_to_probs", "sample", "next_token", "BeamConfig", "Hypothesis",
    "beam_search", "length_penalty", "TextStreamer", "stream_text", "fill_mask", "classify",
    "MaskPrediction", "Classification", "encode_sentences", "encode_masked_text", "EnsembleDecoder",
    "SpeculativeDecoder",
]
