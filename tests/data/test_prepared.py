"""`aiayn prepare`: shards that decode to the tokenizer's encoding, the same batches as the in-memory path,
a resumable prepare, and each bad input refused with the file and line before any training."""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import aiayn.data.prepared as prepared_module
from aiayn.data import DataError, TranslationDataset, read_parallel
from aiayn.data.prepared import MANIFEST, PARTIAL, PrepareSettings, open_prepared, prepare, tokenizer_sha256
from aiayn.data.shards import shard_dtype
from aiayn.tokenization import BPETokenizer, load_tokenizer
from aiayn.training.config import DataSection
from aiayn.training.tasks import build_task_data

WORDS = "der die das Haus Straße Mädchen läuft über grüne a cat dog sat on the mat big small".split()


def write_corpus(directory: Path, n: int = 150, seed: int = 0) -> tuple[Path, Path]:
    rng = random.Random(seed)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(n)]
    src[3] = "  Leerzeichen\u00a0und Tabs\t "  # kept as they are: no-break space, tab, trailing space
    tgt = [" ".join(reversed(s.split(" "))).upper() for s in src]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "src.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (directory / "tgt.txt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return directory / "src.txt", directory / "tgt.txt"


SMALL = PrepareSettings(vocab_size=400, shard_lines=75)  # 150 lines: two shards a side


@pytest.fixture(autouse=True)
def no_fsync(monkeypatch):
    """Durability is not what these tests check; the ~60 fsyncs of a prepare cost most of its time here."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture
def corpus(tmp_path):
    src, tgt = write_corpus(tmp_path / "text")
    return {"train": (src, tgt), "val": (src, tgt)}


def test_shards_round_trip_to_the_tokenizers_encoding(corpus, tmp_path):
    prepare(tmp_path / "prep", corpus, SMALL)
    opened = open_prepared(tmp_path / "prep")
    tok = opened.tokenizer
    pairs = opened.pairs("train")
    src_lines = corpus["train"][0].read_text(encoding="utf-8").splitlines()
    tgt_lines = corpus["train"][1].read_text(encoding="utf-8").splitlines()
    assert len(pairs) == len(src_lines) == 150 and len(opened.manifest["shards"]["train.src"]) == 2
    assert opened.manifest["settings"]["shard_dtype"] == "uint16"
    for i, (s, t) in enumerate(zip(src_lines, tgt_lines)):
        src_ids, tgt_ids = pairs[i]
        assert src_ids.tolist() == tok.encode(s, add_eos=True), i
        assert tgt_ids.tolist() == tok.encode(t), i
        assert tok.decode(tgt_ids.tolist()) == t  # byte-level BPE: lossless
    # The hash of a tokenizer does not depend on where it was loaded from (a resumed run's checkpoint copy).
    assert tokenizer_sha256(load_tokenizer(tmp_path / "prep" / "tokenizer.json")) == opened.manifest["tokenizer"]["sha256"]


def batches_of(task_data):
    loader = task_data.train
    return list(loader), task_data.val


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for field in dataclasses.fields(x):
            assert torch.equal(getattr(x, field.name), getattr(y, field.name)), field.name


@pytest.mark.data
def test_memmap_loader_gives_the_in_memory_loaders_batches_on_multi30k(shared_data, tmp_path):
    """Multi30k de-en (its val set as training pairs, test2016 as validation: the test budget), truncation on:
    every batch of an epoch is equal, bit for bit."""
    m30k = shared_data / "multi30k"
    tok = BPETokenizer.train((m30k / "val.de").read_text(encoding="utf-8").splitlines(), 1000)
    tok.save(tmp_path / "tok")
    splits = {"train": (m30k / "val.de", m30k / "val.en"), "val": (m30k / "test2016.de", m30k / "test2016.en")}
    prepare(tmp_path / "prep", splits, PrepareSettings(tokenizer=str(tmp_path / "tok"), shard_lines=300))
    common = dict(task="translation", max_len=24, too_long="truncate", max_tokens=1024)
    files = dict(dataset="files", train_files=[str(p) for p in splits["train"]], val_files=[str(p) for p in splits["val"]])
    in_memory = build_task_data(DataSection(**files, **common), seed=3, tokenizers=(tok, tok))
    from_shards = build_task_data(DataSection(prepared=str(tmp_path / "prep"), **common), seed=3)
    assert from_shards.train.dataset.n_truncated == in_memory.train.dataset.n_truncated > 0
    train_a, val_a = batches_of(in_memory)
    train_b, val_b = batches_of(from_shards)
    assert len(train_a) > 20
    assert_same_batches(train_a, train_b)
    assert_same_batches(val_a, val_b)


@pytest.mark.parametrize("too_long", ["drop", "truncate"])
def test_long_pairs_dropped_or_truncated_give_the_in_memory_batches(corpus, tmp_path, too_long):
    """Two shards a side, read a batch at a time (``__getitems__``): every batch of an epoch, and the validation
    batches, equal the in-memory path's bit for bit."""
    prepare(tmp_path / "prep", corpus, SMALL)
    tok = open_prepared(tmp_path / "prep").tokenizer
    common = dict(task="translation", max_len=12, too_long=too_long, max_tokens=200)
    files = dict(dataset="files", train_files=[str(p) for p in corpus["train"]], val_files=[str(p) for p in corpus["val"]])
    in_memory = build_task_data(DataSection(**files, **common), seed=1, tokenizers=(tok, tok))
    from_shards = build_task_data(DataSection(prepared=str(tmp_path / "prep"), **common), seed=1)
    counts = [(d.train.dataset.n_dropped, d.train.dataset.n_truncated) for d in (in_memory, from_shards)]
    assert counts[0] == counts[1] and max(counts[0]) > 0
    (train_a, val_a), (train_b, val_b) = batches_of(in_memory), batches_of(from_shards)
    assert_same_batches(train_a, train_b)
    assert_same_batches(val_a, val_b)


@pytest.mark.parametrize("too_long", ["drop", "truncate"])
def test_a_batch_read_at_once_holds_the_in_memory_pairs(corpus, tmp_path, too_long):
    """``PreparedPairs.__getitems__`` (lines of both shards in any order, some cut) against ``TranslationDataset``'s
    items; the lengths the plan is made from are the same, in 16 bits."""
    prepare(tmp_path / "prep", corpus, SMALL)
    opened = open_prepared(tmp_path / "prep")
    pairs = opened.pairs("train", max_len=12, too_long=too_long)
    reference = TranslationDataset.encode(read_parallel(*corpus["train"]), opened.tokenizer, opened.tokenizer, max_len=12,
                                          too_long=too_long)
    assert len(pairs) == len(reference) and pairs.src_lengths.dtype == pairs.tgt_lengths.dtype == np.uint16
    assert np.array_equal(pairs.src_lengths, reference.src_lengths) and np.array_equal(pairs.tgt_lengths, reference.tgt_lengths)
    order = np.random.default_rng(0).permutation(len(pairs))
    batch = pairs.__getitems__(order)
    assert len(batch) == len(pairs)
    for k, i in enumerate(order.tolist()):
        for got, want in zip(batch[k], reference[i]):
            assert got.tolist() == want.tolist(), (i, too_long)
        assert [a.tolist() for a in pairs[i]] == [a.tolist() for a in reference[i]]


def test_a_changed_source_file_is_refused_naming_it(corpus, tmp_path):
    prepare(tmp_path / "prep", corpus, SMALL)
    src = corpus["train"][0]
    src.write_text(src.read_text(encoding="utf-8").replace("cat", "cow", 1), encoding="utf-8")
    with pytest.raises(DataError, match=rf"{src} changed since it was prepared: .*manifest.json \(sources.train.src.sha256\)"):
        open_prepared(tmp_path / "prep")


def test_an_interrupted_prepare_resumes_and_gives_identical_shards(corpus, tmp_path, monkeypatch):
    prepare(tmp_path / "straight", corpus, SMALL)

    written = []
    real_write = prepared_module.write_shard

    def dies_after_three(directory, name, tokens, lengths):
        if len(written) == 3:
            raise KeyboardInterrupt  # the process is stopped in the middle of a side
        written.append(name)
        return real_write(directory, name, tokens, lengths)

    monkeypatch.setattr(prepared_module, "write_shard", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "resumed", corpus, SMALL)
    assert (tmp_path / "resumed" / PARTIAL).is_file() and not (tmp_path / "resumed" / MANIFEST).exists()
    with pytest.raises(DataError, match="prepare did not finish|interrupted prepare"):
        open_prepared(tmp_path / "resumed")

    rewritten = []
    monkeypatch.setattr(prepared_module, "write_shard", lambda *a: rewritten.append(a[1]) or real_write(*a))
    monkeypatch.setattr(BPETokenizer, "train", lambda *a, **k: pytest.fail("the tokenizer was learned again"))
    prepare(tmp_path / "resumed", corpus, SMALL)
    assert not set(rewritten) & set(written) and len(rewritten) == 8 - 3  # 2 splits x 2 sides x 2 shards
    straight = sorted(p.name for p in (tmp_path / "straight").iterdir())
    assert straight == sorted(p.name for p in (tmp_path / "resumed").iterdir()) and PARTIAL not in straight
    for name in straight:
        assert (tmp_path / "straight" / name).read_bytes() == (tmp_path / "resumed" / name).read_bytes(), name


def test_sides_of_different_length_are_refused_naming_the_file_and_line(corpus, tmp_path):
    src, tgt = corpus["train"]
    tgt.write_text("\n".join(tgt.read_text(encoding="utf-8").splitlines()[:140]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{src} has 150 lines, {tgt} has 140; line 141 of {src} has no partner"):
        prepare(tmp_path / "prep", corpus, SMALL)
    assert not (tmp_path / "prep").exists()  # refused before anything was written


def test_a_shard_whose_size_disagrees_with_its_index_is_refused(corpus, tmp_path):
    prepare(tmp_path / "prep", corpus, SMALL)
    shard = tmp_path / "prep" / "train.tgt.00001.bin"
    shard.write_bytes(shard.read_bytes()[:-6])  # the last 3 uint16 ids are gone
    opened = open_prepared(tmp_path / "prep")
    with pytest.raises(DataError, match=rf"{shard}: \d+ bytes, but its index train.tgt.00001.idx.npy .*; line \d+ of the shard \(index entry \d+\) ends past the end"):
        opened.pairs("train")
    with pytest.raises(DataError, match="train.tgt.00001.bin"):  # and so before any training step
        build_task_data(DataSection(task="translation", prepared=str(tmp_path / "prep")), seed=0)


def test_a_manifest_from_another_tokenizer_is_refused(corpus, tmp_path):
    prepare(tmp_path / "prep", corpus, SMALL)
    other = BPETokenizer.train(["something else entirely"] * 5, 300)
    with pytest.raises(DataError, match=r"manifest.json: the shards were written with the tokenizer of sha256 \w+, but the run's src"):
        open_prepared(tmp_path / "prep", tokenizers=(other, other))  # a resumed run whose checkpoint has another tokenizer
    other.save(tmp_path / "prep" / "tokenizer.json")  # the directory's tokenizer replaced
    with pytest.raises(DataError, match=r"tokenizer.json has sha256 \w+, but .*manifest.json \(tokenizer.sha256\) records .* another tokenizer"):
        open_prepared(tmp_path / "prep")


def test_a_vocabulary_too_large_for_uint16_is_refused_before_any_work(corpus, tmp_path):
    with pytest.raises(DataError, match=r"vocab_size=70000\): the vocabulary has 70000 ids .* do not fit uint16"):
        prepare(tmp_path / "prep", corpus, PrepareSettings(vocab_size=70_000, dtype="uint16"))
    assert not (tmp_path / "prep").exists()
    with pytest.raises(DataError, match=r"big/tokenizer.json: the vocabulary has 65537 ids \(largest 65536\)"):
        shard_dtype(65_537, "uint16", "big/tokenizer.json")  # a given tokenizer: named by its file
    assert shard_dtype(65_536, "auto", "x") == "uint16" and shard_dtype(65_537, "auto", "x") == "uint32"


def test_a_directory_prepared_from_other_files_is_refused(corpus, tmp_path):
    prepare(tmp_path / "prep", corpus, SMALL)
    with pytest.raises(DataError, match=r"prepared from other files or settings \(settings.shard_lines: was 75, now 50\)"):
        prepare(tmp_path / "prep", corpus, dataclasses.replace(SMALL, shard_lines=50))
    assert np.load(tmp_path / "prep" / "train.src.00000.idx.npy").shape == (75, 2)  # untouched


def test_prepare_from_the_command_line(corpus, tmp_path, capsys):
    from aiayn.cli.main import main

    (src, tgt), (val_src, val_tgt) = corpus["train"], corpus["val"]
    argv = ["prepare", "files", "--train", str(src), str(tgt), "--val", str(val_src), str(val_tgt),
            "--out", str(tmp_path / "prep"), "--vocab-size", "400", "--shard-lines", "75"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "train: 150 pairs" in out and "shards: uint16" in out and f"data.prepared={tmp_path / 'prep'}" in out
    assert (tmp_path / "prep" / MANIFEST).is_file()


def test_wmt14_offline_says_which_archives_to_put_where(tmp_path, monkeypatch, capsys):
    from aiayn.cli.main import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("AIAYN_DATA_DIR", raising=False)
    assert main(["prepare", "wmt14-en-de", "--out", str(tmp_path / "prep"), "--no-download"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'cache' / 'aiayn' / 'data' / 'wmt14-en-de' / 'training-parallel-europarl-v7.tgz'}" in err
    assert "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz" in err and "downloads are off" in err
    assert "split 'newstest2013': files ['dev.tgz'] not found" in err  # every missing archive in one message


def test_wmt14_sides_are_taken_out_of_the_archives_in_order(tmp_path):
    import io
    import tarfile

    from aiayn.data.wmt14 import extract_sides

    def archive(name, files):
        with tarfile.open(tmp_path / name, "w:gz") as tar:
            for member, text in files.items():
                data = text.encode()
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return tmp_path / name

    archives = {
        "a.tgz": archive("a.tgz", {"training/x.de-en.en": "one\ntwo", "training/x.de-en.de": "eins\nzwei\n"}),  # no final newline
        "b.tgz": archive("b.tgz", {"y.de-en.en": "three\n", "y.de-en.de": "drei\n", "y.de-en.fr": "trois\n"}),
    }
    sides = (tmp_path / "train.en", tmp_path / "train.de")
    extract_sides(archives, (("a.tgz", "x.de-en.{}"), ("b.tgz", "y.de-en.{}")), sides)
    assert sides[0].read_text() == "one\ntwo\nthree\n" and sides[1].read_text() == "eins\nzwei\ndrei\n"
    with pytest.raises(DataError, match=r"b.tgz: holds no file named z.de-en.en"):
        extract_sides(archives, (("b.tgz", "z.de-en.{}"),), sides)
