"""Ids past the model's vocabulary (issue 31, item 4): a tokenizer larger than the embedding table is
refused at load, naming both sizes; a prompt id outside the table is refused before the first kernel,
in every decode path (growing, static and compiled caches, no cache, encoder-decoder), never an
``IndexError`` from inside the embedding."""

import pytest
import torch
from decoding_helpers import enc_dec, gpt

import aiayn
from aiayn.cli.main import main
from aiayn.decoding import CausalLMDecoder, GenerationConfig, Seq2SeqDecoder, generate
from aiayn.pretrained import save_pretrained
from aiayn.tokenization import CharTokenizer

pytestmark = pytest.mark.reliability


def test_a_tokenizer_larger_than_the_embedding_table_is_refused_at_load(tmp_path):
    small = CharTokenizer.train(["abc"])
    directory = save_pretrained(tmp_path / "lm", gpt(vocab_size=small.vocab_size), small)
    CharTokenizer.train(["abcdefgh"]).save(directory / "char_tokenizer.json")  # 5 more ids than the table has rows
    words = f"the tokenizer has {small.vocab_size + 5} ids .* vocab_size is {small.vocab_size}"
    with pytest.raises(ValueError, match=words):
        aiayn.load(directory)
    with pytest.raises(SystemExit, match=words):
        main(["generate", "--checkpoint", str(directory), "--prompt", "h", "--max-new-tokens", "2"])


@pytest.mark.parametrize("make", [
    lambda m: CausalLMDecoder(m), lambda m: CausalLMDecoder(m, static_cache=True), lambda m: CausalLMDecoder(m, use_cache=False),
], ids=["growing", "static", "no-cache"])  # compile=True runs the static prefill eagerly: the same check
def test_a_prompt_id_outside_the_vocabulary_is_refused_before_any_kernel(make):
    model = gpt("rotary")
    ids = torch.tensor([[7, 8, model.config.vocab_size]])
    with pytest.raises(ValueError, match=f"holds token id {model.config.vocab_size}, outside the vocabulary of vocab_size=64"):
        generate(make(model), ids, None, GenerationConfig(max_new_tokens=3, greedy=True))


@pytest.mark.parametrize("static_cache", [False, True])
def test_a_source_id_outside_the_vocabulary_is_refused(static_cache):
    model = enc_dec()
    with pytest.raises(ValueError, match="src holds token id 99, outside the vocabulary"):
        generate(Seq2SeqDecoder(model, static_cache=static_cache), torch.tensor([[7, 99]]), None, GenerationConfig(greedy=True))
