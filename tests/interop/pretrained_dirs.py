"""Tiny Hugging Face model directories with their own tokenizers, built in the test (no download).

Each directory is what ``save_pretrained`` writes for the model and for its tokenizer (BERT:
WordPiece ``tokenizer.json``; GPT-2: byte-level BPE with ``<|endoftext|>``; BART: byte-level BPE with
``<s> x </s>``; Marian: ``source.spm``, ``target.spm`` and ``vocab.json``), so the special ids are the
checkpoint's own, not ours.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from interop_helpers import randomize

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SENTENCES = [
    "the cat sat on the mat .", "a dog runs in the park .", "the dogs sat on a mat .", "cats run and dogs sit .",
    "a man rides a horse .", "the woman reads a book .", "two children play in the snow .", "a bird sings .",
]
GERMAN = [
    "die katze sitzt auf der matte .", "ein hund läuft im park .", "die hunde sitzen auf einer matte .",
    "katzen laufen und hunde sitzen .", "ein mann reitet ein pferd .", "die frau liest ein buch .",
    "zwei kinder spielen im schnee .", "ein vogel singt .",
]


def wordpiece_tokenizer():
    """A BERT-style WordPiece tokenizer: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, then words."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    words = sorted({w for s in SENTENCES for w in s.split()})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "##s", "##ing"])}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tok


def bert_dir(path: Path, cls_name: str = "BertForMaskedLM", seed: int = 0, **overrides) -> Path:
    tok = wordpiece_tokenizer()
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=24, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
        max_position_embeddings=40, type_vocab_size=2, pad_token_id=0, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, **overrides,
    )
    torch.manual_seed(seed)
    model = randomize(getattr(transformers, cls_name)(config), seed)
    model.save_pretrained(path)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )
    fast.save_pretrained(path)
    return path


def bpe_tokenizer():
    """GPT-2's layout: byte-level BPE whose only special token, ``<|endoftext|>``, is id 0."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    return tok


def gpt2_dir(path: Path, seed: int = 0) -> Path:
    tok = bpe_tokenizer()
    eot = tok.token_to_id("<|endoftext|>")
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=24, n_layer=2, n_head=4, n_inner=40, bos_token_id=eot,
        eos_token_id=eot, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    model = randomize(transformers.GPT2LMHeadModel(config), seed)
    model.save_pretrained(path)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>",
    ).save_pretrained(path)
    return path


def bart_dir(path: Path, seed: int = 0) -> Path:
    """BART's layout: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4, byte-level BPE, and its
    template (``RobertaProcessing``: a source is ``<s> x </s>``); decoding starts from ``</s>``."""
    from interop_helpers import bart
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), add_prefix_space=False)
    model = bart(seed, vocab_size=tok.get_vocab_size(), pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                 encoder_layers=1, decoder_layers=1)
    model.save_pretrained(path)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>", mask_token="<mask>",
    ).save_pretrained(path)
    return path


def spm_model(lines: list[str], vocab_size: int = 40) -> bytes:
    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 4), model_writer=out, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, minloglevel=2, hard_vocab_limit=False,
    )
    return out.getvalue()


def marian_dir(path: Path, seed: int = 0) -> Path:
    """Marian's layout: ``</s>`` 0, ``<unk>`` 1, the pieces of both sides, ``<pad>`` last; decoding starts from pad."""
    import sentencepiece

    path.mkdir(parents=True, exist_ok=True)
    source, target = spm_model(GERMAN), spm_model(SENTENCES)
    (path / "source.spm").write_bytes(source)
    (path / "target.spm").write_bytes(target)
    pieces: list[str] = []
    for proto in (source, target):
        sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]
    ordered = ["</s>", "<unk>", *dict.fromkeys(p for p in pieces if p not in ("</s>", "<unk>", "<pad>")), "<pad>"]
    vocab = {p: i for i, p in enumerate(ordered)}
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    pad = vocab["<pad>"]
    settings = dict(
        vocab_size=len(vocab), d_model=24, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=64,
        activation_function="gelu", scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad,
        eos_token_id=0, forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
    )
    torch.manual_seed(seed)
    model = randomize(transformers.MarianMTModel(transformers.MarianConfig(**settings)), seed)
    model.save_pretrained(path)
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "MarianTokenizer", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}),
        encoding="utf-8",
    )
    return path
