"""``train.init_from`` a Hugging Face directory: the run takes its config, tokenizer and weights.

BERT: a classifier added with fresh weights (reported); GPT-2: language modelling on a text file;
Marian: translation on parallel files. Each then runs through the commands with its own special ids.
"""

from __future__ import annotations

import logging

import pytest
import torch
from pretrained_dirs import GERMAN, SENTENCES, bert_dir, gpt2_dir, marian_dir

import aiayn
from aiayn.cli.main import main
from aiayn.interop import load_hf
from aiayn.training.config import DataSection, LoopSection, ModelSection, TrainConfig
from aiayn.training.loop import train
from aiayn.training.optim import OptimConfig, ScheduleConfig


def _config(tmp_path, init_from, data: DataSection, **model) -> TrainConfig:
    return TrainConfig(
        run_dir=str(tmp_path / "run"), model=ModelSection(**model), data=data,
        optim=OptimConfig(name="adamw", lr=1e-3), schedule=ScheduleConfig(name="constant", warmup=0),
        train=LoopSection(init_from=str(init_from), max_steps=2, eval_every=2, save_every=2, log_every=1, progress=False,
                          tensorboard=False),
    )


def test_bert_without_a_classifier_gets_one_and_classifies_with_label_names(tmp_path, caplog, capsys):
    hf_dir = bert_dir(tmp_path / "bert", "BertModel")
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{'pos' if i % 2 else 'neg'}\t{SENTENCES[i % len(SENTENCES)]}\n" for i in range(16)))
    data = DataSection(task="classification", dataset="files", train_files=[str(tsv)], val_files=[str(tsv)], batch_size=4, max_len=32)
    with caplog.at_level(logging.WARNING):
        result = train(_config(tmp_path, hf_dir, data, dropout=0.0))
    assert "newly initialised (not in the checkpoint): classifier.weight, classifier.bias" in caplog.text
    imported = load_hf(hf_dir).config
    assert result.model.config == imported.replace(n_classes=2, dropout=0.0)  # the checkpoint's config, the section over it
    assert result.data.src_tokenizer.special_ids.cls == 2  # the checkpoint's [CLS], not ours (4)
    assert int(result.data.val[0].input[0, 0]) == 2
    assert main(["classify", "--checkpoint", str(result.run_dir), SENTENCES[0]]) == 0
    label = capsys.readouterr().out.split("\t")[0]
    assert label in ("neg", "pos")
    assert aiayn.load(result.run_dir).classify(SENTENCES[0])[0].label == label


def test_gpt2_fine_tunes_on_a_text_file(tmp_path, capsys):
    hf_dir = gpt2_dir(tmp_path / "gpt2")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(SENTENCES) * 20)
    data = DataSection(task="lm", dataset="files", train_files=[str(text)], block_size=16, batch_size=4)
    before = load_hf(hf_dir).model.state_dict()
    result = train(_config(tmp_path, hf_dir, data))
    assert result.model.config == load_hf(hf_dir).config
    assert any(not torch.equal(v, result.model.state_dict()[k]) for k, v in before.items())  # it trained
    assert main(["generate", "--checkpoint", str(result.run_dir), "--prompt", "the cat", "--max-new-tokens", "4", "--greedy"]) == 0
    assert capsys.readouterr().out.startswith("the cat")


def test_marian_fine_tunes_on_parallel_files(tmp_path, capsys):
    hf_dir = marian_dir(tmp_path / "marian")
    src, tgt = tmp_path / "train.de", tmp_path / "train.en"
    src.write_text("\n".join(GERMAN * 3) + "\n")
    tgt.write_text("\n".join(SENTENCES * 3) + "\n")
    data = DataSection(task="translation", dataset="files", train_files=[str(src), str(tgt)], val_files=[str(src), str(tgt)],
                       max_tokens=256, max_len=32)
    result = train(_config(tmp_path, hf_dir, data))
    batch = result.data.val[0]
    pad = result.data.tgt_tokenizer.special_ids.pad
    assert bool((batch.tgt_in[:, 0] == pad).all())  # Marian's decoder starts from its pad id
    assert bool((batch.tgt_out[batch.tgt_mask] == 0).sum() == batch.tgt_in.shape[0])  # one </s> (id 0) per target, counted
    assert main(["translate", "--checkpoint", str(result.run_dir), "--beam-size", "2", "--max-new-tokens", "5", GERMAN[0]]) == 0
    assert len(aiayn.load(result.run_dir).translate(GERMAN[:2], beam_size=2, max_new_tokens=5)) == 2


def test_init_from_another_family_is_refused_naming_the_directory(tmp_path):
    hf_dir = gpt2_dir(tmp_path / "gpt2")
    text = tmp_path / "text.txt"
    text.write_text(" ".join(SENTENCES) * 20)
    data = DataSection(task="lm", dataset="files", train_files=[str(text)], block_size=16, batch_size=4)
    with pytest.raises(ValueError, match=rf"train.init_from: {hf_dir} holds a decoder-only model, but the recipe's model.family is 'encoder-only'"):
        train(_config(tmp_path, hf_dir, data, family="encoder-only"))


def test_bert_masked_lm_fine_tune_masks_with_its_own_mask_id(tmp_path):
    hf_dir = bert_dir(tmp_path / "bert")  # BertForMaskedLM: [MASK] is 4, specials 0..4
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"0\t{SENTENCES[i % len(SENTENCES)]}\n" for i in range(16)))
    data = DataSection(task="mlm", dataset="files", train_files=[str(tsv)], val_files=[str(tsv)], batch_size=8, max_len=32)
    result = train(_config(tmp_path, hf_dir, data, dropout=0.0))
    assert "val_loss" in result.metrics
    batch = result.data.val[0]
    predicted = batch.labels != -100
    assert bool(predicted.any())
    changed = batch.input[predicted][batch.input[predicted] != batch.labels[predicted]].tolist()
    assert 4 in changed and all(t == 4 or t >= 5 for t in changed)  # [MASK] (4) or a random ordinary token
    assert not bool(((batch.labels >= 0) & (batch.labels <= 4)).any())  # specials are never targets
