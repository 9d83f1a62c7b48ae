"""An offline character-level tokenizer for the synthetic tasks.

One token per character, built with the `tokenizers` library and wrapped as a transformers
`PreTrainedTokenizerFast`, so it saves and loads like any Hub tokenizer
(`save_pretrained(dir)` → `AutoTokenizer.from_pretrained(dir)`) and the tiny model and real models share one
code path. Nothing is downloaded.

Encoding a text prepends `<bos>` (a fixed first token gives attention somewhere to rest; with left padding it is
also the first real position); `<eos>` is never added automatically — the warm start appends it to targets and the
generator stops on it.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

from forge_exp.choices import ALPHABET, TOOL_ALPHABET  # noqa: F401 — the character sets (model.alphabet)

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK)  # ids 0..3, in this order


def build_char_tokenizer(alphabet: str = ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level `PreTrainedTokenizerFast`: ids 0..3 are <pad> <eos> <bos> <unk>, then one id per character
    of `alphabet` in order. Padding is on the left, as the generator and the trainer expect for prompts."""
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"tokenizer alphabet has repeated characters: {alphabet!r}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    tok = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    # Every character (spaces included) is its own pre-token; Fuse joins the pieces back without separators.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    return wrapped


def load_char_tokenizer(path: str) -> PreTrainedTokenizerFast:
    """The character tokenizer saved in `path` (a warm start or checkpoint of the tiny model). Read as the class it
    is: `AutoTokenizer` would first import transformers' whole tokenizer registry (~0.3 s of every process's start)."""
    return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True, padding_side="left")
