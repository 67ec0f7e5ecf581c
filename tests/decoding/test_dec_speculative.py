"""Speculative decoding: greedy output is plain greedy token for token (every family and position kind
that generates, growing and static caches, prompt lookup and a draft model), sampling keeps the target
distribution (the acceptance rule, by a chi-square test), the entry points, and bad input."""

from __future__ import annotations

import time

import pytest
import torch
from decoding_helpers import enc_dec, gpt, random_rows

from aiayn import build_model
from aiayn.cli.main import main
from aiayn.decoding import CausalLMDecoder, GenerationConfig, Seq2SeqDecoder, generate, sample
from aiayn.decoding.speculative import NgramIndex, SpeculativeDecoder, accept_or_resample, lookup_continuation
from aiayn.nn.cache import LayerCache, StaticLayerCache
from aiayn.pretrained import save_pretrained
from aiayn.tokenization import CharTokenizer

GREEDY = GenerationConfig(max_new_tokens=30, greedy=True, eos_id=None)
CHI2_5_DF_999 = 20.515  # scipy.stats.chi2.ppf(0.999, df=5): a correct sampler fails this one time in a thousand


def same_as_plain(decoder: SpeculativeDecoder, model, ids, config=GREEDY) -> None:
    plain = generate(model, ids, None, config).tokens
    assert torch.equal(generate(decoder, ids, None, config).tokens, plain)
    assert decoder.drafted > 0 and decoder.forwards < config.max_new_tokens  # drafts were checked, fewer forwards


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "alibi", "none"])
def test_prompt_lookup_greedy_is_plain_greedy(positions):
    model = gpt(positions)
    ids = torch.tensor(random_rows([12], seed=1))
    for static in (False, True):
        same_as_plain(SpeculativeDecoder(CausalLMDecoder(model, static_cache=static), ngram=2), model, ids)


def test_rejected_drafts_roll_the_cache_back():
    model = gpt("sinusoidal")  # its greedy output copies the prompt only in part: drafts are accepted and rejected
    speculative = SpeculativeDecoder(model, ngram=2)
    same_as_plain(speculative, model, torch.tensor(random_rows([12], seed=1)))
    assert 0 < speculative.accepted < speculative.drafted


def test_draft_model_greedy_is_plain_greedy():
    model, ids = gpt("rotary"), torch.tensor(random_rows([12], seed=1))
    torch.manual_seed(5)
    other = build_model("tiny-decoder-only", positions="rotary", n_layers=1).eval()
    same_as_plain(SpeculativeDecoder(model, mode="draft", draft_tokens=3, draft_model=other), model, ids)
    itself = SpeculativeDecoder(model, mode="draft", draft_tokens=3, draft_model=model)
    same_as_plain(itself, model, ids)
    assert itself.accepted == itself.drafted  # the target drafting for itself is always right
    draft = itself.drafter.decoder  # decoded as the target is: a static cache, not one grown by a concatenation a step
    assert isinstance(draft, CausalLMDecoder) and draft.static_cache
    state = draft.start(ids, None, max_new_tokens=GREEDY.max_new_tokens)[0]
    assert all(type(c) is StaticLayerCache for c in state.cache.self_attn)


def test_penalties_see_the_emitted_history_not_the_drafts():
    model, ids = gpt("rotary"), torch.tensor(random_rows([12], seed=1))
    config = GenerationConfig(max_new_tokens=30, greedy=True, eos_id=None, repetition_penalty=1.5, no_repeat_ngram_size=3)
    plain = generate(model, ids, None, config).tokens
    assert torch.equal(generate(SpeculativeDecoder(model, ngram=2), ids, None, config).tokens, plain)


def test_encoder_decoder_greedy_is_plain_greedy():
    model, src = enc_dec(), torch.tensor(random_rows([9], seed=2))
    for static in (False, True):
        same_as_plain(SpeculativeDecoder(Seq2SeqDecoder(model, static_cache=static), ngram=2), model, src)
    drafted = SpeculativeDecoder(model, mode="draft", draft_model=enc_dec(n_decoder_layers=1))
    same_as_plain(drafted, model, src)
    assert isinstance(drafted.drafter.decoder, Seq2SeqDecoder) and drafted.drafter.decoder.static_cache


def test_acceptance_rule_keeps_the_target_distribution():
    g = torch.Generator().manual_seed(0)
    n = 100_000
    p = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10]).expand(n, 6)
    q = torch.tensor([0.40, 0.05, 0.25, 0.05, 0.05, 0.20]).expand(n, 6)
    drafts = sample(q, g)
    out = accept_or_resample(p, q, drafts, g)

    def chi2(tokens):
        counts = torch.bincount(tokens, minlength=6).double()
        return float(((counts - n * p[0]) ** 2 / (n * p[0])).sum())

    assert chi2(out) < CHI2_5_DF_999
    assert chi2(drafts) > 100 * CHI2_5_DF_999  # the test can fail: the drafts alone are far from p
    accepted = float((out == drafts).double().mean())
    assert abs(accepted - float(torch.minimum(p[0], q[0]).sum())) < 0.01  # acceptance = 1 - TV(p, q) = 0.45


def chi2_pooled(counts: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom, the cells expected fewer than 5 times pooled into one."""
    small = expected < 5
    counts = torch.cat([counts[~small], counts[small].sum()[None]]) if small.any() else counts
    expected = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    return float(((counts - expected) ** 2 / expected).sum()), len(expected) - 1


def test_draft_model_sampling_keeps_the_target_distribution():
    """End to end: the second token (the first drafted one) is distributed as the target's marginal."""
    target = gpt("rotary", vocab_size=8, tie_output=False)
    torch.manual_seed(1)
    draft = build_model("tiny-decoder-only", positions="rotary", vocab_size=8, n_layers=1, tie_output=False).eval()
    with torch.no_grad():  # sharper, different distributions (random init is near uniform)
        target.output.weight.mul_(30)
        draft.output.weight.mul_(30)
    prompt = torch.tensor([[3, 4, 5, 6]])

    def second_token(model):  # sum over t1 of p(t1) model(t2 | t1)
        with torch.no_grad():
            first = target(prompt)[0, -1].softmax(-1)
            return sum(first[t] * model(torch.cat([prompt, torch.tensor([[t]])], 1))[0, -1].softmax(-1) for t in range(8))

    p, q = second_token(target), second_token(draft)
    n, g = 300, torch.Generator().manual_seed(0)
    speculative = SpeculativeDecoder(target, mode="draft", draft_tokens=1, draft_model=draft)
    config = GenerationConfig(max_new_tokens=2, eos_id=None)
    counts = torch.zeros(8)
    for _ in range(n):
        counts[generate(speculative, prompt, None, config, generator=g).tokens[0, 1]] += 1
    stat, df = chi2_pooled(counts, n * p.double())
    assert df >= 2 and stat < {2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}[df]  # chi2.ppf(0.999, df)
    assert chi2_pooled(n * q.double(), n * p.double())[0] > 1000  # the test can fail: the draft's own marginal is far from p


def test_sampling_with_a_draft_model_runs_the_rule():
    model = gpt("rotary", vocab_size=16)
    g = torch.Generator().manual_seed(0)
    config = GenerationConfig(max_new_tokens=8, eos_id=None, temperature=1.5)
    itself = SpeculativeDecoder(model, mode="draft", draft_tokens=3, draft_model=model)
    out = generate(itself, torch.tensor([[5, 6, 7]]), None, config, generator=g)
    assert out.tokens.shape == (1, 8) and itself.drafted > 0 and itself.accepted == itself.drafted  # p == q: all kept


def test_lookup_takes_the_last_earlier_occurrence():
    history = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert lookup_continuation(history, 3, 2) == [7, 8]  # Hugging Face's first occurrence would give [9, 1]
    assert lookup_continuation([5, 6, 4, 6], 3, 4) == [4, 6, 4, 6]  # the 1-gram [6], then copied on with period 2
    assert lookup_continuation([7, 7, 7], 3, 3) == [7, 7, 7]  # a loop of period 1 drafts as many as asked
    assert lookup_continuation([1, 2, 3], 3, 4) == []


def test_the_ngram_index_drafts_what_the_scan_drafts():
    """A run's index (kept as its history grows a token or a few at a time) gives lookup_continuation's drafts at every
    length, over few-token vocabularies (many repeats, loops) and a many-token one (few matches); a shorter history than
    the last one is indexed anew."""
    g = torch.Generator().manual_seed(0)
    for vocab, ngram, count in ((2, 3, 4), (3, 3, 7), (5, 2, 5), (50, 3, 3), (4, 1, 6)):
        history = torch.randint(vocab, (8,), generator=g).tolist()
        index = NgramIndex(ngram)
        while len(history) < 120:
            assert index.continuation(history, count) == lookup_continuation(history, ngram, count), (vocab, ngram, history)
            history += torch.randint(vocab, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
        shorter = history[:30]
        assert index.continuation(shorter, count) == lookup_continuation(shorter, ngram, count)
    assert NgramIndex(3).continuation([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2) == [7, 8]


class Scripted:
    """Drafts the plain answer, wrong (each token + 1) in the rounds listed; records the counts asked for."""

    def __init__(self, answer: list[int], prefix: int, wrong: set[int]) -> None:
        self.answer, self.prefix, self.wrong, self.counts = answer, prefix, wrong, []

    def start(self, ids, mask, max_new_tokens):
        return None

    def propose(self, sequence, count, run, config, generator):
        self.counts.append(count)
        done = len(sequence) - self.prefix
        drafts = [t + 1 if len(self.counts) in self.wrong else t for t in self.answer[done : done + count]]
        return drafts, [None] * len(drafts)


def test_draft_length_shrinks_after_a_rejection_and_grows_after_a_full_acceptance():
    model, ids = gpt("sinusoidal"), torch.tensor(random_rows([12], seed=1))  # its output takes 11 distinct tokens
    config = GenerationConfig(max_new_tokens=40, greedy=True, eos_id=None)
    plain = generate(model, ids, None, config).tokens
    speculative = SpeculativeDecoder(model, draft_tokens=4)
    speculative.drafter = drafter = Scripted(plain[0].tolist(), ids.shape[1], wrong={1, 2, 3, 4})
    assert torch.equal(generate(speculative, ids, None, config).tokens, plain)
    # rounds 1-4 rejected: 4, 3, 2, 1, 1; then all accepted: 3, 4, 4, ... (K = 4 at most)
    assert drafter.counts[:8] == [4, 3, 2, 1, 1, 3, 4, 4]


def test_cache_crop():
    k = torch.randn(1, 2, 5, 4)
    for cache in (LayerCache(), StaticLayerCache(8)):
        cache.update(k, k, None, True)
        cache.crop(3)
        assert cache.length == 3
        cache.update(k[:, :, :1], k[:, :, :1], None, True)
        assert cache.length == 4
        with pytest.raises(ValueError, match="crop length=5"):
            cache.crop(5)


def test_bad_input():
    model = gpt("rotary")
    with pytest.raises(ValueError, match=r"speculative='ngram' must be one of \('prompt-lookup', 'draft'\)"):
        SpeculativeDecoder(model, mode="ngram")
    with pytest.raises(ValueError, match="draft_tokens=0 must be an integer >= 1"):
        SpeculativeDecoder(model, draft_tokens=0)
    with pytest.raises(ValueError, match="ngram=0 must be an integer >= 1"):
        SpeculativeDecoder(model, ngram=0)
    with pytest.raises(ValueError, match="needs draft_model"):
        SpeculativeDecoder(model, mode="draft")
    with pytest.raises(ValueError, match="draft_model: its vocab_size=32 differs from the target's vocab_size=64"):
        SpeculativeDecoder(model, mode="draft", draft_model=gpt("rotary", vocab_size=32))
    with pytest.raises(ValueError, match="model.attention=local cannot .* works with model.attention=softmax"):
        SpeculativeDecoder(gpt("rotary", attention="local", window=4))
    with pytest.raises(ValueError, match="model.mixer=ssm cannot .* works with model.mixer=attention"):
        SpeculativeDecoder(gpt("none", mixer="ssm"))
    with pytest.raises(ValueError, match=r"ids must have shape \(1, L\), got \(2, 3\)"):
        generate(SpeculativeDecoder(model), torch.tensor([[5, 6, 7], [5, 6, 7]]), None, GREEDY)


def test_past_learned_positions_decodes_plainly():
    model = gpt("learned", max_len=20)
    ids = torch.tensor(random_rows([12], seed=1))
    speculative = SpeculativeDecoder(model)
    assert torch.equal(generate(speculative, ids, None, GREEDY).tokens, generate(model, ids, None, GREEDY).tokens)
    assert speculative.drafted == 0


@pytest.fixture(scope="module")
def saved_lm(tmp_path_factory):
    tokenizer = CharTokenizer.train(["abcabcabc the cat sat on the mat"])
    torch.manual_seed(0)
    model = build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size).eval()
    return str(save_pretrained(tmp_path_factory.mktemp("lm") / "model", model, tokenizer)), tokenizer


def test_cli_and_api(saved_lm, tmp_path, capsys):
    path, _ = saved_lm
    base = ["generate", "--checkpoint", path, "--prompt", "abcabcabc", "--max-new-tokens", "12", "--greedy"]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main([*base, "--speculative", "prompt-lookup", "--draft-tokens", "3"]) == 0
    assert capsys.readouterr().out == plain
    assert main([*base, "--speculative", "draft", "--draft-checkpoint", path]) == 0
    assert capsys.readouterr().out == plain
    import aiayn

    loaded = aiayn.load(path)
    text = loaded.generate(["abcabcabc", "the cat"], max_new_tokens=12, greedy=True)
    assert loaded.generate(["abcabcabc", "the cat"], max_new_tokens=12, greedy=True, speculative="prompt-lookup") == text
    assert text[0] == plain.rstrip("\n")

    with pytest.raises(SystemExit, match="--draft-tokens=0 must be an integer >= 1"):
        main([*base, "--speculative", "prompt-lookup", "--draft-tokens", "0"])
    with pytest.raises(SystemExit, match="--speculative draft needs --draft-checkpoint"):
        main([*base, "--speculative", "draft"])
    other_tok = CharTokenizer.train(["xyz"])
    other = save_pretrained(tmp_path / "other", build_model("tiny-decoder-only", vocab_size=other_tok.vocab_size).eval(), other_tok)
    with pytest.raises(SystemExit, match="--draft-checkpoint .* has another tokenizer"):
        main([*base, "--speculative", "draft", "--draft-checkpoint", str(other)])
    with pytest.raises(SystemExit):
        main([*base, "--speculative", "medusa"])
    assert "invalid choice: 'medusa'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="aiayn serve: --draft-tokens must be >= 1, got 0"):
        main(["serve", "--checkpoint", path, "--speculative", "prompt-lookup", "--draft-tokens", "0"])


def test_server_prompt_lookup(saved_lm):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from aiayn.serve.app import create_app
    from aiayn.serve.loading import load_served_model

    path, _ = saved_lm
    body = {"prompt": "abcabcabc", "max_tokens": 12, "temperature": 0}
    texts = []
    for speculative in (None, {"speculative": "prompt-lookup", "draft_tokens": 3, "ngram": 2}):
        app = create_app(lambda: load_served_model(path, name="tiny"), speculative=speculative)
        with TestClient(app) as client:
            deadline = time.monotonic() + 20
            while client.get("/health").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.02)
            texts.append(client.post("/v1/completions", json=body).json()["choices"][0]["text"])
            decoder = app.state.server.engine.decoder
    assert texts[0] == texts[1] and texts[0]
    assert isinstance(decoder, SpeculativeDecoder) and decoder.drafted > 0 and app.state.server.engine.max_batch == 1
