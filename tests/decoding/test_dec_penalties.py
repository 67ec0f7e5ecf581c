"""The logits processors the server, the CLI and Python share (OpenAI's presence and frequency
penalties, ``logit_bias``, min-p, CTRL's repetition penalty), each against a logit change computed by
hand on a toy vocabulary, and through :func:`next_token` with a :class:`GenerationConfig`."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.decoding.processors import add_logit_bias, apply_presence_frequency_penalties, apply_repetition_penalty, min_p_filter
from aiayn.decoding.protocol import DecodeState
from aiayn.decoding.sampling import GenerationConfig, next_token

NEG_INF = float("-inf")


def test_presence_and_frequency_penalties_count_the_generated_tokens_only():
    logits = torch.zeros(1, 5)
    history = torch.tensor([[1, 2, 2, 3]])  # prompt [1], then 2, 2, 3 generated
    out = apply_presence_frequency_penalties(logits, history, torch.tensor([3]), presence=0.5, frequency=0.25)
    # token 2: twice -> 2 * 0.25 + 0.5; token 3: once -> 0.25 + 0.5; token 1 is in the prompt only: untouched
    assert out.tolist() == [[0.0, 0.0, -1.0, -0.75, 0.0]]


def test_logit_bias_adds_to_the_named_tokens():
    out = add_logit_bias(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), [(1, 2.5), (3, -100.0)])
    assert out.tolist() == [[1.0, 4.5, 3.0, -96.0]]


def test_min_p_keeps_tokens_at_least_min_p_times_the_best():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    out = min_p_filter(logits, 0.2)  # threshold 0.2 * 0.5 = 0.1: only the 0.05 token goes
    assert out[0, :3].tolist() == pytest.approx(logits[0, :3].tolist()) and out[0, 3] == NEG_INF


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    out = apply_repetition_penalty(torch.tensor([[2.0, -1.0, 0.5]]), torch.tensor([[0, 1]]), None, 2.0)
    assert out.tolist() == [[1.0, -2.0, 0.5]]


def test_next_token_applies_the_config():
    """Token 0 leads by 0.4; a presence penalty of 0.5 on it (it was generated) hands the choice to token 1."""
    logits = torch.tensor([[1.4, 1.0, 0.0]])
    state = DecodeState(tokens=torch.tensor([[2, 0]]), mask=torch.ones(1, 2, dtype=torch.bool), max_new_tokens=torch.tensor([5]),
                        pads=torch.tensor([0]))
    generated = torch.tensor([1])
    assert next_token(logits, state, generated, GenerationConfig(greedy=True)).tolist() == [0]
    assert next_token(logits, state, generated, GenerationConfig(greedy=True, presence_penalty=0.5)).tolist() == [1]
    assert next_token(logits, state, generated, GenerationConfig(greedy=True, logit_bias=((2, 2.0),))).tolist() == [2]
    only_best = GenerationConfig(min_p=math.exp(-0.3))  # token 1 is exp(-0.4) times as likely as token 0: gone
    draws = {int(next_token(logits, state, generated, only_best, torch.Generator().manual_seed(s))[0]) for s in range(20)}
    assert draws == {0}


@pytest.mark.parametrize("field, value", [("presence_penalty", 2.5), ("frequency_penalty", float("nan")), ("min_p", 1.5),
                                          ("logit_bias", ((-1, 1.0),))])
def test_config_names_the_bad_value(field, value):
    with pytest.raises(ValueError, match=field):
        GenerationConfig(**{field: value})


def test_the_cli_takes_the_same_processors(tmp_path, capsys):
    """``aiayn generate --frequency-penalty/--presence-penalty/--min-p``: the text of ``generate`` with that config."""
    from aiayn import build_model
    from aiayn.cli.main import main
    from aiayn.decoding.adapters import CausalLMDecoder
    from aiayn.decoding.generation import generate
    from aiayn.decoding.text import generation_config
    from aiayn.pretrained import save_pretrained
    from aiayn.tokenization import CharTokenizer

    tok = CharTokenizer.train(["the cat sat on the mat"])
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=tok.vocab_size, max_len=32).eval()
    save_pretrained(tmp_path / "m", model, tok)
    flags = {"presence_penalty": 0.7, "frequency_penalty": 0.4, "min_p": 0.05}
    argv = ["generate", "--checkpoint", str(tmp_path / "m"), "--prompt", "the", "--max-new-tokens", "12", "--seed", "3",
            *(x for k, v in flags.items() for x in (f"--{k.replace('_', '-')}", str(v)))]
    assert main(argv) == 0
    config = generation_config(tok, max_new_tokens=12, **flags)
    out = generate(CausalLMDecoder(model), torch.tensor([tok.encode("the")]), None, config, generator=torch.Generator().manual_seed(3))
    assert capsys.readouterr().out == "the" + tok.decode(out.sequences()[0]) + "\n"
    import aiayn  # Python takes the same processors, and gives the same text

    assert aiayn.load(tmp_path / "m").generate("the", max_new_tokens=12, seed=3, **flags) == "the" + tok.decode(out.sequences()[0])
    with pytest.raises(SystemExit, match="--presence-penalty=3.0"):
        main([*argv[:7], "--presence-penalty", "3"])
