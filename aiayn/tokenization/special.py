"""Special tokens and their fixed ids, shared by every tokenizer and model of the library.

The ids are part of the checkpoint format: a model's ``pad_id`` is ``PAD_ID`` unless its config says
otherwise, and every tokenizer puts these tokens first, in this order.
"""

from __future__ import annotations

PAD, BOS, EOS, UNK, CLS, SEP, MASK = "<pad>", "<bos>", "<eos>", "<unk>", "<cls>", "<sep>", "<mask>"

SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, CLS, SEP, MASK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
