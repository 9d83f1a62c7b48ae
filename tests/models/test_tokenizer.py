"""The character tokenizer: one id per character, <bos> prepended, round-trips through save/AutoTokenizer."""

from transformers import AutoTokenizer

from forge_exp.models.tokenizer import ALPHABET, BOS, EOS, PAD, UNK, build_char_tokenizer


def test_one_token_per_character_with_bos_first():
    tok = build_char_tokenizer()
    ids = tok("37+48= 85")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert ids[1:] == [tok.convert_tokens_to_ids(c) for c in "37+48= 85"]
    assert len(set(ids[1:])) == len(set("37+48= 85"))
    assert tok.decode(ids, skip_special_tokens=True) == "37+48= 85"  # spaces survive, nothing is inserted
    assert tok("85", add_special_tokens=False)["input_ids"] == tok.convert_tokens_to_ids(["8", "5"])


def test_special_tokens_and_vocab_layout():
    tok = build_char_tokenizer()
    assert [tok.pad_token, tok.eos_token, tok.bos_token, tok.unk_token] == [PAD, EOS, BOS, UNK]
    assert [tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    assert len(tok) == 4 + len(ALPHABET)
    assert tok.padding_side == "left"
    assert tok("x", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]  # not in the alphabet
    assert tok.decode([tok.convert_tokens_to_ids("4"), tok.eos_token_id, tok.pad_token_id]) == f"4{EOS}{PAD}"


def test_left_padding_batch():
    tok = build_char_tokenizer()
    batch = tok(["1+2=", "37+48="], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1, 1, 1]


def test_save_pretrained_round_trips_through_auto_tokenizer(tmp_path):
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for text in ["12*34=", "99-9= 90", "7/7="]:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
        assert again.decode(again(text)["input_ids"], skip_special_tokens=True) == text
    assert (again.pad_token_id, again.eos_token_id, again.bos_token_id) == (0, 1, 2)
    assert again.padding_side == "left"
