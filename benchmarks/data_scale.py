"""Does the prepared-shard data path hold at WMT14's scale? On a synthetic corpus of N pairs (default 4.5M,
Multi30k's 29k English-German pairs repeated in a new order each time):

- the time and peak RSS of ``aiayn prepare`` (learning a shared BPE of 37000 ids, tokenizing, writing shards);
- the RSS of a training process over the data (shards opened, batch plan made, batches read) on N pairs
  against Multi30k's 29k pairs, and the time from opening the shards to the end of the first base-model step;
- the batches/s the loader gives (the recipe's micro-batches: 3125 tokens a side; the median of 3 rounds after the
  first 300 batches, which are timed too), against a base-model step:
  measured here on the CPU, and estimated for one H200 (an estimate, stated with its assumptions).

Each measurement runs in a fresh process, so that peaks are its own. The last lines say, target by target
(issue 32), whether each one is met. A --pairs of 100000 checks the script in a few minutes.

    nice -n 10 python benchmarks/data_scale.py --data-dir ../shared/data --work /tmp/data_scale

A corpus already in --work (or given by --corpus) is used as it is, and so are finished shards: the prepare
is then not measured again (delete its directory to measure it), only the training processes run.
--prepared takes a prepared directory made elsewhere (e.g. `aiayn prepare wmt14-en-de`) and skips both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from aiayn.cpu import cpu_summary

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 3125  # the recipe's micro-batch: 25000 tokens a side over 8 micro-batches
# The paper's base model: 100k steps in 12 hours on 8 P100s (section 5.2), one 3125-token micro-batch per GPU a step.
PAPER_STEP_S = 12 * 3600 / 100_000
H200_BF16_FLOPS, ASSUMED_MFU = 790e12, 0.3  # dense bf16 peak; the fraction a 3125-token micro-batch is assumed to reach
PLANNED_STEP_S = 0.03  # the step docs/training.md plans for on an H200 (launch-bound: 20-40 ms)
# The targets of issue 32, each checked by the last lines of the report.
PREPARE_MAX_S, PREPARE_MAX_MB = 600, 4096  # 10 minutes on 2 idle cores, 4 GB
RSS_GROWTH_MAX_MB = 200  # anonymous RSS of a training process: N pairs against Multi30k's 29k
FIRST_BATCH_MAX_S = 10  # opening the shards, planning the epoch and collating the first batch
LOADER_MIN_RATIO = 10  # loader batches/s over the arithmetic H200 step rate, one loader process


def memory() -> dict[str, int]:
    """This process's VmHWM (peak), VmRSS, RssAnon and RssFile in MB, from /proc/self/status (Linux)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) // 1024
    return out


def make_corpus(data_dir: Path, work: Path, pairs: int) -> tuple[Path, Path]:
    """``corpus.en`` / ``corpus.de``: Multi30k train pairs, repeated in a fresh shuffled order until ``pairs``."""
    en_path, de_path = work / f"corpus-{pairs}.en", work / f"corpus-{pairs}.de"
    if en_path.is_file() and de_path.is_file():
        return en_path, de_path
    en = (data_dir / "multi30k" / "train.en").read_text(encoding="utf-8").splitlines()
    de = (data_dir / "multi30k" / "train.de").read_text(encoding="utf-8").splitlines()
    rng = random.Random(0)
    with open(en_path, "w", encoding="utf-8") as fe, open(de_path, "w", encoding="utf-8") as fd:
        left = pairs
        while left:
            order = list(range(len(en)))
            rng.shuffle(order)
            order = order[:left]
            fe.write("".join(en[i] + "\n" for i in order))
            fd.write("".join(de[i] + "\n" for i in order))
            left -= len(order)
    return en_path, de_path


def child(args: list[str]) -> dict:
    """Run this script's ``args`` in a fresh process; its last stdout line is its JSON result."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{args[0]} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_prepare(src: str, tgt: str, val_src: str, val_tgt: str, out: str, tokenizer: str) -> None:
    from aiayn.data.prepared import PrepareSettings, prepare

    started = time.perf_counter()
    settings = PrepareSettings(vocab_size=37_000, tokenizer=tokenizer or None)
    prepare(out, {"train": (Path(src), Path(tgt)), "val": (Path(val_src), Path(val_tgt))}, settings)
    print(json.dumps({"seconds": round(time.perf_counter() - started, 1), **memory()}))


def run_train(prepared: str, batches: int, step: bool) -> None:
    """Open the shards, take the first batch, time the loader; with ``step``, then one base-model training step."""
    import torch

    from aiayn.models.presets import build_model
    from aiayn.training.objectives import Objective

    before = memory()
    started = time.perf_counter()
    data, loader = training_loader(prepared, workers=0)
    batch = next(loader)  # the epoch's batch plan is made here
    data_s = time.perf_counter() - started
    first = batches_per_s(loader, 300)  # the first batches after the first: the shards' pages still cold
    rounds = [batches_per_s(loader, batches) for _ in range(3)]  # then the rate a run keeps: the median of 3 rounds
    result = {
        "pairs": len(data.train.dataset), "data_s": round(data_s, 2), "loader_first_300_batches_per_s": round(first, 1),
        "loader_rounds": [round(r, 1) for r in rounds], "loader_batches_per_s": round(statistics.median(rounds), 1),
        "sentences_per_batch": batch.batch_size, "rss_before_data": before, "rss_after_data": memory(),
    }
    result["loader_2_workers_batches_per_s"] = round(loader_rate(prepared, batches, workers=2), 1)  # after the RSS: workers add processes
    if step:
        model = build_model("paper-base", vocab_size=data.src_tokenizer.vocab_size)
        objective = Objective(model, "translation", label_smoothing=0.1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        step_started = time.perf_counter()
        loss = objective(batch)
        (loss.sum / loss.count).backward()
        optimizer.step()
        result |= {"step_s": round(time.perf_counter() - step_started, 2),
                   "first_step_s": round(data_s + time.perf_counter() - step_started, 2), "rss_after_step": memory()}
    print(json.dumps(result))


def training_loader(prepared: str, *, workers: int) -> tuple[Any, Iterator[Any]]:
    """The recipe's training data on ``prepared`` (``data.num_workers=workers``), and its batches epoch after epoch,
    as the training loop reads them."""
    from aiayn.training.config import DataSection
    from aiayn.training.tasks import build_task_data

    section = DataSection(task="translation", prepared=prepared, max_len=256, max_tokens=MAX_TOKENS, num_workers=workers)
    data = build_task_data(section, seed=0)
    return data, (batch for _ in iter(int, 1) for batch in data.train)


def batches_per_s(loader: Iterator[Any], batches: int) -> float:
    """How many batches a second ``loader`` gives over the next ``batches``."""
    timed = time.perf_counter()
    for _ in range(batches):
        next(loader)
    return batches / (time.perf_counter() - timed)


def loader_rate(prepared: str, batches: int, *, workers: int) -> float:
    """Batches/s the training loader gives with ``data.num_workers=workers``, after 50 batches of warm-up (the workers'
    start): each batch crosses from a worker as its tensors, each over a socket with its own shared memory."""
    _, loader = training_loader(prepared, workers=workers)
    batches_per_s(loader, 50)
    return batches_per_s(loader, batches)


def base_micro_batch_flops(vocab: int, tokens: int) -> float:
    """6 x (non-embedding parameters x source and target tokens + output projection x target tokens)."""
    d, ff, layers = 512, 2048, 6
    encoder = layers * (4 * d * d + 2 * d * ff)
    decoder = layers * (8 * d * d + 2 * d * ff)
    return 6 * (encoder * tokens + decoder * tokens + d * vocab * tokens)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True, help="the data root holding multi30k/ (e.g. ../shared/data)")
    p.add_argument("--work", default="/tmp/data_scale", help="where the corpus and shards go (about 2 GB at 4.5M pairs)")
    p.add_argument("--pairs", type=int, default=4_500_000, help="pairs of the synthetic corpus (not read with --corpus)")
    p.add_argument("--corpus", nargs=2, metavar=("SRC", "TGT"), help="parallel files to prepare instead of the synthetic corpus")
    p.add_argument("--prepared", help="a prepared directory to train on as it is: no corpus, no prepare")
    p.add_argument("--batches", type=int, default=1000, help="loader batches a round: 3 rounds timed after the first 300")
    args = p.parse_args()
    work, data_dir = Path(args.work), Path(args.data_dir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_summary()}; load average {os.getloadavg()[0]:.1f}; "
          f"python {platform.python_version()}", flush=True)
    val = (str(data_dir / "multi30k" / "val.en"), str(data_dir / "multi30k" / "val.de"))
    big, prep = big_shards(args, work, data_dir, val)
    manifest = json.loads((big / "manifest.json").read_text())
    # The 29k shards get the big ones' vocabulary, so the models match: one directory per tokenizer, made
    # from a copy of it in --work (a prepare records the tokenizer's path, wherever the big shards are).
    sha = manifest["tokenizer"]["sha256"][:8]
    small, tokenizer = work / f"prepared-29k-{sha}", work / f"tokenizer-{sha}.json"
    if not tokenizer.is_file():
        shutil.copyfile(big / manifest["tokenizer"]["file"], tokenizer)
    child(["_prepare", str(data_dir / "multi30k" / "train.en"), str(data_dir / "multi30k" / "train.de"), *val, str(small),
           str(tokenizer)])
    runs = {"29k": child(["_train", str(small), str(args.batches), "0"]), "big": child(["_train", str(big), str(args.batches), "1"])}
    for r in runs.values():
        print(json.dumps(r), flush=True)  # the raw numbers, whatever the lines below make of them
        rss = r["rss_after_data"]
        print(f"training process on {r['pairs']} pairs: shards open + first batch {r['data_s']} s; after the data and "
              f"{300 + 3 * args.batches} batches: RSS {rss['VmRSS']} MB (anonymous {rss['RssAnon']}, file-backed {rss['RssFile']}), "
              f"peak {rss['VmHWM']} MB (before the data: {r['rss_before_data']['VmRSS']} MB); loader "
              f"{r['loader_batches_per_s']} batches/s of about {r['sentences_per_batch']} sentences (median of "
              f"{r['loader_rounds']}; the first 300 batches: {r['loader_first_300_batches_per_s']}/s)", flush=True)
    grown = runs["big"]["rss_after_data"]["VmHWM"] - runs["29k"]["rss_after_data"]["VmHWM"]
    anon = runs["big"]["rss_after_data"]["RssAnon"] - runs["29k"]["rss_after_data"]["RssAnon"]
    pairs = runs["big"]["pairs"]
    print(f"training RSS over the data, {pairs} pairs minus 29k: peak {grown:+d} MB, anonymous {anon:+d} MB")
    big_run = runs["big"]
    print(f"base model (paper-base), one step on {big_run['sentences_per_batch']} sentences here: {big_run['step_s']} s; "
          f"the first step done {big_run['first_step_s']} s after opening the shards (model building excluded); "
          f"peak RSS then {big_run['rss_after_step']['VmHWM']} MB")
    arithmetic = H200_BF16_FLOPS * ASSUMED_MFU / base_micro_batch_flops(manifest["tokenizer"]["vocab_size"], MAX_TOKENS)
    loader = big_run["loader_batches_per_s"]
    print(f"a base-model micro-batch step, estimated: {1 / PAPER_STEP_S:.1f}/s on a P100 (the paper's rate); on an H200 "
          f"{arithmetic:.0f}/s from the arithmetic (bf16 at {ASSUMED_MFU:.0%} of {H200_BF16_FLOPS / 1e12:.0f} TFLOP/s), "
          f"{1 / PLANNED_STEP_S:.0f}/s at the {PLANNED_STEP_S * 1000:.0f} ms a step docs/training.md plans for (estimates)")
    print(f"loader / H200 step rate: {loader / arithmetic:.1f}x (arithmetic), {loader * PLANNED_STEP_S:.1f}x (planned), "
          "with one loader process")
    workers = big_run["loader_2_workers_batches_per_s"]
    print(f"with data.num_workers=2: {workers} batches/s ({workers / loader:.2f}x the one process): each batch's tensors "
          "cross from a worker one by one over a socket, which costs the training process more than reading the batch")
    report_targets(prep, anon, grown, big_run, arithmetic, pairs)


def big_shards(args: argparse.Namespace, work: Path, data_dir: Path, val: tuple[str, str]) -> tuple[Path, dict | None]:
    """The shards to measure, and the prepare's measurement (None when the shards were already there)."""
    if args.prepared:
        print(f"training on {args.prepared} as it is: the prepare is not measured", flush=True)
        return Path(args.prepared), None
    en, de = (Path(f) for f in args.corpus) if args.corpus else make_corpus(data_dir, work, args.pairs)
    big = work / (f"prepared-{args.pairs}" if not args.corpus else f"prepared-{en.stem}")
    if (big / "manifest.json").is_file():
        print(f"{big} is already prepared: its shards are used as they are and the prepare is not measured "
              "(delete the directory to measure it)", flush=True)
        return big, None
    if (big / "manifest.partial.json").is_file():
        print(f"{big}: an interrupted prepare, resumed: its time is that of the rest only", flush=True)
    prep = child(["_prepare", str(en), str(de), *val, str(big), ""])
    print(json.dumps(prep), flush=True)
    print(f"prepare {en.name}: {prep['seconds']} s, peak RSS {prep['VmHWM']} MB", flush=True)
    return big, prep


def report_targets(prep: dict | None, anon: int, grown: int, run: dict, arithmetic: float, pairs: int) -> None:
    """One line per target of issue 32: the measured value, the bound, and met / NOT MET."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT MET"

    print(f"targets (issue 32), on {pairs} pairs:")
    if prep is None:
        print(f"  prepare <= {PREPARE_MAX_S} s and <= {PREPARE_MAX_MB} MB peak RSS: not measured in this run (shards reused)")
    else:
        ok = prep["seconds"] <= PREPARE_MAX_S and prep["VmHWM"] <= PREPARE_MAX_MB
        print(f"  prepare <= {PREPARE_MAX_S} s and <= {PREPARE_MAX_MB} MB peak RSS: {prep['seconds']} s, {prep['VmHWM']} MB: "
              f"{verdict(ok)}")
    print(f"  training RSS growth over 29k pairs <= {RSS_GROWTH_MAX_MB} MB (anonymous: the process's own memory): {anon:+d} MB: "
          f"{verdict(anon <= RSS_GROWTH_MAX_MB)} (peak RSS {grown:+d} MB, with the shard pages the page cache shares and can drop)")
    print(f"  first step's batch <= {FIRST_BATCH_MAX_S} s after opening the shards: {run['data_s']} s: "
          f"{verdict(run['data_s'] <= FIRST_BATCH_MAX_S)} (the step itself, {run['step_s']} s on this CPU, is milliseconds on an H200)")
    loader = run["loader_batches_per_s"]
    print(f"  loader >= {LOADER_MIN_RATIO}x the arithmetic H200 step rate ({LOADER_MIN_RATIO * arithmetic:.0f} batches/s), "
          f"one process: {loader} batches/s = {loader / arithmetic:.1f}x: {verdict(loader >= LOADER_MIN_RATIO * arithmetic)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_prepare":
        run_prepare(*sys.argv[2:8])
    elif len(sys.argv) > 1 and sys.argv[1] == "_train":
        run_train(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
    else:
        main()
