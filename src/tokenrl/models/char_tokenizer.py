"""A character-level tokenizer built in memory, for random-weight models (tests, GPU throughput runs).

Ids: 0 <pad>, 1 <eos>, 2 <unk>, then printable ASCII, then `<|fill_i|>` placeholders up to `vocab_size`
so that any id a random model samples decodes to something.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = [c for c in string.printable if c not in "\x0b\x0c"]


def build_char_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Character tokenizer with exactly `vocab_size` ids (at least len(SPECIALS) + len(CHARS))."""
    base = SPECIALS + CHARS
    if vocab_size < len(base):
        raise ValueError(
            f"model.architecture.vocab_size={vocab_size} is below the {len(base)} ids a "
            f"character tokenizer needs; raise it"
        )
    vocab = {tok: i for i, tok in enumerate(base)}
    vocab.update({f"<|fill_{i}|>": i for i in range(len(base), vocab_size)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
