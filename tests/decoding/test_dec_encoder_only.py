"""fill_mask and classify for the encoder-only family."""

import pytest
import torch

from aiayn import build_model
from aiayn.decoding import classify, encode_masked_text, encode_sentences, fill_mask
from aiayn.tokenization import CharTokenizer
from aiayn.tokenization.special import CLS_ID, MASK_ID, SEP_ID


def bert(**overrides):
    torch.manual_seed(0)
    return build_model("tiny-encoder-only", **overrides).eval()


def test_fill_mask_ranks_candidates_from_the_mlm_head():
    model = bert()
    ids = torch.tensor([[CLS_ID, 9, MASK_ID, 11, MASK_ID, SEP_ID], [CLS_ID, MASK_ID, 12, SEP_ID, 0, 0]])
    out = fill_mask(model, ids, top_k=3)
    assert [[p.position for p in row] for row in out] == [[2, 4], [1]]
    probs = model.masked_lm_logits(model(ids)).softmax(-1)
    probs[..., :7] = -1  # specials are not offered
    for b, row in enumerate(out):
        for prediction in row:
            expected = probs[b, prediction.position].topk(3)
            assert prediction.token_ids == expected.indices.tolist()
            assert prediction.probs == pytest.approx(expected.values.tolist(), abs=1e-6)
            assert prediction.probs == sorted(prediction.probs, reverse=True)


def test_fill_mask_without_masks_or_head():
    assert fill_mask(bert(), torch.tensor([[CLS_ID, 9, SEP_ID]])) == [[]]
    with pytest.raises(ValueError, match="no masked-LM head"):
        fill_mask(bert(mlm_head=False), torch.tensor([[CLS_ID, MASK_ID, SEP_ID]]))
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        fill_mask(bert(), torch.tensor([[CLS_ID, MASK_ID, SEP_ID]]), top_k=0)


def test_classify_batch_equals_one_by_one():
    model = bert(n_classes=3)
    tokenizer = CharTokenizer.train(["hello world, good bad"])
    texts = ["hello world", "bad", "good good"]
    result = classify(model, *encode_sentences(tokenizer, texts))
    assert result.probs.shape == (3, 3)
    torch.testing.assert_close(result.probs.sum(-1), torch.ones(3))
    assert torch.equal(result.labels, result.probs.argmax(-1))
    for i, text in enumerate(texts):
        alone = classify(model, *encode_sentences(tokenizer, [text]))
        torch.testing.assert_close(alone.probs[0], result.probs[i], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no classification head"):
        classify(bert(n_classes=0), torch.tensor([[CLS_ID, SEP_ID]]))


def test_encode_masked_text_never_spells_out_the_mask():
    tokenizer = CharTokenizer.train(["the cat"])
    ids = encode_masked_text(tokenizer, "the <mask>at<mask>")
    assert ids == [CLS_ID, *tokenizer.encode("the "), MASK_ID, *tokenizer.encode("at"), MASK_ID, SEP_ID]
