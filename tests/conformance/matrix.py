"""The conformance matrix: every model variant of :mod:`variants` through every entry point.

A cell returns ``"yes"`` when the entry point's greedy output equals an independent fp32 reference
token for token (a forward pass per token over the whole prefix, no cache; the same precision's
Python output for bf16 and int8), or ``"refused: ..."`` when it raises an error that names the
option (asserted in the cell). Any other exception (a raw ``AttributeError`` from inside the
library) fails the cell. ``"-"``: the entry point does not exist for the family.

``python tests/conformance/matrix.py`` runs every cell and rewrites ``docs/support.md``;
``test_conformance.py`` fails when the page differs from what the code does: each cell's test against the
page's cell, and the page's text against the table made from its own cells (so no cell runs twice).
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from variants import LABELS, PROMPT, SOURCE, VARIANTS, variant_dir  # noqa: E402

import aiayn  # noqa: E402
from aiayn.cli.main import main  # noqa: E402
from aiayn.decoding import CausalLMDecoder, GenerationConfig, Seq2SeqDecoder, beam_search, generate, left_pad  # noqa: E402
from aiayn.decoding.text import beam_config, pad_id, prompt_ids, source_ids  # noqa: E402
from aiayn.tokenization.special import special_ids  # noqa: E402

SUPPORT_PAGE = Path(__file__).resolve().parents[2] / "docs" / "support.md"
NEW = 8  # tokens generated per cell
COMPILED = "lm-rotary"  # one compile for the static KV cache kind (compiling is ~20 s on a CPU)
MASKED = "the <mask> sat on a mat ."
COLUMNS = ["python", "python list", "cli", "static cache", "compile", "bfloat16", "int8", "past context", "score", "other family"]


@cache
def loaded(name: str, dtype: str | None = None, quantize: str | None = None) -> aiayn.LoadedModel:
    return aiayn.load(variant_dir(name), dtype=dtype, quantize=quantize)


def cli(*argv: str) -> str:
    """``aiayn ARGV`` in this process; its standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def refused(call: Callable[[], object], *words: str, kinds: tuple[type[BaseException], ...] = (ValueError, SystemExit)) -> str:
    """Run ``call``; it must raise one of ``kinds`` whose message names every one of ``words``."""
    try:
        call()
    except kinds as e:
        message = str(e)
        missing = [w for w in words if w not in message]
        assert not missing, f"the error does not name {missing}: {message!r}"
        return "refused: " + ", ".join(words)
    raise AssertionError(f"expected an error naming {words}, got none")


# --- references: a forward pass over the whole prefix for every token, no cache ---------------------


def lm_reference(model: torch.nn.Module, ids: list[int], n: int, eos: int | None) -> list[int]:
    window = model.config.max_len if model.positions.kind == "learned" else None  # the crop past learned positions
    seq, out = list(ids), []
    for _ in range(n):
        x = torch.tensor([seq[-window:] if window else seq])
        token = int(model(x, torch.ones_like(x, dtype=torch.bool))[0, -1].argmax())
        out.append(token)
        if token == eos:
            break
        seq.append(token)
    return out


def s2s_reference(model: torch.nn.Module, src: list[int], n: int, bos: int, eos: int | None) -> list[int]:
    x = torch.tensor([src])
    memory = model.encode(x, torch.ones_like(x, dtype=torch.bool))
    seq, out = [bos], []
    for _ in range(n):
        tgt = torch.tensor([seq])
        token = int(model.decode(tgt, memory, src_mask=torch.ones_like(x, dtype=torch.bool), tgt_mask=torch.ones_like(tgt, dtype=torch.bool))[0, -1].argmax())
        out.append(token)
        if token == eos:
            break
        seq.append(token)
    return out


def past_context(model: torch.nn.Module) -> int:
    """Tokens to generate past the learned positions (6 more than they hold), or 2 NEW where positions extrapolate."""
    return model.config.max_len + 6 if model.positions.kind == "learned" else 2 * NEW


# --- decoder-only ----------------------------------------------------------------------------------


def _lm(name: str, column: str) -> str:
    m, d = loaded(name), str(variant_dir(name))
    tok, model = m.tokenizer, m.model
    eos = special_ids(tok).eos
    ids = prompt_ids(tok, PROMPT)
    n = past_context(model) if column == "past context" else NEW
    text = PROMPT + tok.decode(lm_reference(model, ids, n, eos))
    if column == "python":
        assert m.generate(PROMPT, NEW, greedy=True) == text
    elif column == "python list":
        refused(lambda: m.generate([], NEW), "prompt", "empty list")
        refused(lambda: m.generate(5, NEW), "prompt must be a str or a list of str", kinds=(TypeError,))  # type: ignore[arg-type]
        other = PROMPT[:3]
        assert m.generate([PROMPT, other], NEW, greedy=True) == [text, other + tok.decode(lm_reference(model, prompt_ids(tok, other), NEW, eos))]
    elif column == "cli":
        assert cli("generate", "--checkpoint", d, "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--greedy") == text + "\n"
    elif column in ("static cache", "compile"):
        compile = column == "compile"
        blocker = next((f"{k}={model.config.__dict__[k]!r}" for k, ok in (("mixer", "attention"), ("attention", "softmax"))
                        if model.config.__dict__[k] != ok), "positions='alibi'" if model.positions.kind == "alibi" else None)
        if compile and blocker:
            return refused(lambda: cli("generate", "--checkpoint", d, "--prompt", PROMPT, "--max-new-tokens", "2", "--compile"),
                           "--compile", blocker, "without compile")
        if compile and name != COMPILED:
            return "yes (as lm-rotary)"  # one compile per cache kind: this one has lm-rotary's
        config = GenerationConfig(max_new_tokens=NEW, greedy=True, eos_id=eos, pad_id=pad_id(tok))
        rows = [ids, ids[:2]]  # a left-padded batch, for the static cache's padding mask
        # Compiled: the Linear layers as aiayn.load gives them (packed for oneDNN), and int8 weights (an opaque op to inductor).
        for target in [model] + ([loaded(name, quantize="int8").model] if compile else []):
            got = generate(CausalLMDecoder(target, static_cache=True, compile=compile), *left_pad(rows, pad_id(tok)), config)
            assert got.sequences() == [lm_reference(target, row, NEW, eos) for row in rows]
    elif column in ("bfloat16", "int8"):
        flag, value = ("--dtype", "bfloat16") if column == "bfloat16" else ("--quantize", "int8")
        half = loaded(name, dtype="bfloat16") if column == "bfloat16" else loaded(name, quantize="int8")
        expected = PROMPT + tok.decode(lm_reference(half.model, ids, NEW, eos))
        assert half.generate(PROMPT, NEW, greedy=True) == expected
        assert cli("generate", "--checkpoint", d, "--prompt", PROMPT, "--max-new-tokens", str(NEW), "--greedy", flag, value) == expected + "\n"
    elif column == "past context":
        assert cli("generate", "--checkpoint", d, "--prompt", PROMPT, "--max-new-tokens", str(n), "--greedy") == text + "\n"
    elif column == "score":
        bos = special_ids(tok).bos
        seq = ([bos] if bos is not None else []) + tok.encode(PROMPT)
        x = torch.tensor([seq])
        logp = model(x[:, :-1], torch.ones_like(x[:, :-1], dtype=torch.bool)).log_softmax(-1).gather(-1, x[:, 1:, None]).sum()
        assert math.isclose(m.score([PROMPT])[0], float(logp), rel_tol=1e-5)
    elif column == "other family":
        return refused(lambda: m.translate([PROMPT]), "translate()", "encoder-decoder")
    return "yes"


# --- encoder-decoder -------------------------------------------------------------------------------


def _s2s(name: str, column: str) -> str:
    m, d = loaded(name), str(variant_dir(name))
    model, src_tok, tgt_tok = m.model, m.src_tokenizer, m.tgt_tokenizer
    tgt_ids = special_ids(tgt_tok)
    src = source_ids(src_tok, SOURCE)

    def reference(loaded_model: aiayn.LoadedModel, texts: list[str], n: int = NEW) -> list[str]:  # beam search without a cache
        decoder = Seq2SeqDecoder(loaded_model.model, use_cache=False, bos_id=tgt_ids.need("bos", "translation"))
        out = []
        for text in texts:
            hyps = beam_search(decoder, torch.tensor([source_ids(src_tok, text)]), None, beam_config(tgt_tok, beam_size=2, max_new_tokens=n))
            out.append(tgt_tok.decode(hyps[0][0].tokens))
        return out

    if column == "python":
        assert m.translate(SOURCE, beam_size=2, max_new_tokens=NEW) == reference(m, [SOURCE])
    elif column == "python list":
        assert m.translate([SOURCE, "ein"], beam_size=2, max_new_tokens=NEW) == reference(m, [SOURCE, "ein"])
    elif column == "cli":
        out = cli("translate", "--checkpoint", d, "--beam-size", "2", "--max-new-tokens", str(NEW), SOURCE)
        assert out == reference(m, [SOURCE])[0] + "\n"
    elif column == "static cache":
        decoder = Seq2SeqDecoder(model, static_cache=True, bos_id=tgt_ids.need("bos", "translation"))
        got = generate(decoder, torch.tensor([src]), None, GenerationConfig(max_new_tokens=NEW, greedy=True, eos_id=tgt_ids.eos))
        assert got.sequences()[0] == s2s_reference(model, src, NEW, tgt_ids.need("bos", "translation"), tgt_ids.eos)
    elif column == "compile":
        return "-"  # aiayn translate has no --compile: beam search over the growing cache
    elif column in ("bfloat16", "int8"):
        flag, value = ("--dtype", "bfloat16") if column == "bfloat16" else ("--quantize", "int8")
        half = loaded(name, dtype="bfloat16") if column == "bfloat16" else loaded(name, quantize="int8")
        expected = reference(half, [SOURCE])
        assert half.translate(SOURCE, beam_size=2, max_new_tokens=NEW) == expected
        assert cli("translate", "--checkpoint", d, "--beam-size", "2", "--max-new-tokens", str(NEW), flag, value, SOURCE) == expected[0] + "\n"
    elif column == "past context":
        limit = model.config.max_len if model.tgt_positions.kind == "learned" else None
        if limit is None:
            assert m.translate(SOURCE, beam_size=2, max_new_tokens=2 * NEW) == reference(m, [SOURCE], 2 * NEW)
            return "yes (no learned limit)"
        return refused(lambda: cli("translate", "--checkpoint", d, "--max-new-tokens", str(limit + 1), SOURCE),
                       "max_new_tokens", str(limit))
    elif column == "score":
        scores = m.score([SOURCE, "ein"], ["a dog", "a"])
        assert scores == [m.score([SOURCE], ["a dog"])[0], m.score(["ein"], ["a"])[0]] and all(math.isfinite(s) for s in scores)
    elif column == "other family":
        return refused(lambda: m.generate(PROMPT), "generate()", "decoder-only")
    return "yes"


# --- encoder-only ----------------------------------------------------------------------------------


def _enc(name: str, column: str) -> str:
    m, d = loaded(name), str(variant_dir(name))
    model, tok = m.model, m.tokenizer
    specials = special_ids(tok)
    masked = MASKED.replace("<mask>", tok.id_to_token(specials.mask)) if specials.mask is not None else MASKED
    has_mlm, has_head = model.config.mlm_head, bool(model.config.n_classes)

    def expected_fill(target: aiayn.LoadedModel) -> str:
        from aiayn.decoding.encoder_only import encode_masked_text

        ids = encode_masked_text(tok, masked)
        at = ids.index(specials.mask)
        logits = target.model.masked_lm_logits(target.model(torch.tensor([ids]))[0, at]).float()
        logits[list(specials.ids())] = -math.inf
        return tok.decode([int(logits.argmax())]).strip()

    def expected_label(target: aiayn.LoadedModel) -> str:
        cls, sep = specials.cls, specials.sep
        x = torch.tensor([[cls, *tok.encode(SOURCE), sep]])
        names = target.labels or LABELS
        return names[int(target.model.classification_logits(target.model(x)).argmax())]

    def check(target: aiayn.LoadedModel, *flags: str) -> None:
        if has_mlm:
            assert target.fill_mask(masked).candidates[0][0][0] == expected_fill(target)
            assert cli("fill-mask", "--checkpoint", d, "--top-k", "1", *flags, masked).splitlines()[-1] == "filled: " + target.fill_mask(masked).text
        if has_head:
            (prediction,) = target.classify([SOURCE])
            assert prediction.label == expected_label(target)
            assert cli("classify", "--checkpoint", d, *flags, SOURCE).split("\t")[0] == prediction.label

    if column in ("python", "cli"):
        check(m)
        if not has_head:
            return "yes (fill-mask); classify " + refused(lambda: m.classify([SOURCE]), "n_classes=0")
        if not has_mlm:
            return "yes (classify); fill-mask " + refused(lambda: m.fill_mask(masked), "mask")
    elif column == "python list":
        if has_head:
            assert [p.label for p in m.classify([SOURCE, "a cat"])] == [m.classify(SOURCE)[0].label, m.classify("a cat")[0].label]
        else:
            return "-"
    elif column in ("bfloat16", "int8"):
        check(loaded(name, dtype="bfloat16") if column == "bfloat16" else loaded(name, quantize="int8"),
              *(("--dtype", "bfloat16") if column == "bfloat16" else ("--quantize", "int8")))
    elif column == "score":
        if not has_mlm:
            return refused(lambda: m.score([SOURCE]), "mask")
        assert all(math.isfinite(s) for s in m.score([SOURCE, "a cat"]))
    elif column == "other family":
        return refused(lambda: m.generate(PROMPT), "generate()", "decoder-only")
    else:
        return "-"  # no token-by-token decoding
    return "yes"


_FAMILY = {"decoder-only": _lm, "encoder-decoder": _s2s, "encoder-only": _enc}


@cache
def cell(name: str, column: str) -> str:
    """The outcome of variant ``name`` through entry point ``column`` (see the module docstring)."""
    torch.manual_seed(0)
    with torch.no_grad():
        return _FAMILY[VARIANTS[name].family](name, column)


def support_table(outcome: Callable[[str, str], str] = cell) -> str:
    """docs/support.md: every cell as ``outcome`` gives it (by default, from running it)."""
    lines = [
        "# What works with what",
        "",
        "Every model variant through every entry point, as `tests/conformance/` runs them on tiny models.",
        "`yes`: greedy output equal token for token to a reference that recomputes the whole prefix for",
        "every token in fp32 (bf16 and int8: the same reference in that precision); `refused`: a clear",
        "error naming the option, before any work; `-`: the entry point does not exist for the family.",
        "",
        "Generated: `.venv/bin/python tests/conformance/matrix.py` rewrites this page from the code, and",
        "`tests/conformance/test_conformance.py` fails when it is out of date.",
        "",
        "| variant | family | settings | " + " | ".join(COLUMNS) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |",
    ]
    for name, variant in VARIANTS.items():
        cells = [outcome(name, column) for column in COLUMNS]
        lines.append(f"| {name} | {variant.family} | {variant.setting} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def page_cells(page: str) -> dict[tuple[str, str], str]:
    """The cells of a support page's table, by (variant, column): what :func:`support_table` wrote."""
    rows = [line.strip("|").split(" | ") for line in page.splitlines() if line.startswith("| ") and not line.startswith(("| variant", "| ---"))]
    return {(row[0].strip(), column): value.strip() for row in rows for column, value in zip(COLUMNS, row[3:])}


if __name__ == "__main__":
    from aiayn.checkpoint.atomic_io import atomic_write_bytes

    atomic_write_bytes(SUPPORT_PAGE, support_table().encode())
    print(f"wrote {SUPPORT_PAGE}")
