#!/usr/bin/env python3
"""Builds small BPE tokenizers with HF `tokenizers` and records their reference encodings.

Writes tests/fixtures/tokenizers/<name>/{tokenizer.json, tokenizer_config.json (some), cases.json}:
  sp-prepend  SentencePiece/Llama: normalizer Prepend("▁")+Replace(" ","▁"), byte fallback, BOS <s>, Strip decoder
  sp-jamba    Jamba's layout: Replace(" ","▁") only, byte fallback, <|startoftext|>=1, chat special tokens
  metaspace   Metaspace pre-tokenizer (prepend_scheme "always", split) and decoder, byte fallback
  bytelevel   GPT-2 ByteLevel pre-tokenizer (regex split) and decoder, BOS via TemplateProcessing
The reference ids come from reloading each saved tokenizer.json with Tokenizer.from_file.
"""
import argparse
import json
import pathlib

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

import tokenizer_kit as kit

VOCAB_SIZE = 2000
TRAINING_CHARS = 1_000_000


def build_sp_prepend(texts):
    specials = ["<unk>", "<s>", "</s>"]
    vocab, merges = kit.train_bpe(
        kit.spiece_training_texts(texts), VOCAB_SIZE, specials + kit.BYTE_TOKENS,
        kit.spiece_pre_tokenizer_for_training(), limit_alphabet=120,
    )
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(kit.SPIECE_SPACE), normalizers.Replace(" ", kit.SPIECE_SPACE)])
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace(kit.SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    kit.add_tokens(tokenizer, special=specials)
    tokenizer.post_processor = kit.bos_template("<s>", vocab["<s>"])
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}
    return tokenizer, config, ["<s>", "</s>"]


def build_sp_jamba(texts):
    specials = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|unk|>"]
    chat = ["<|bom|>", "<|eom|>", "<|system|>", "<|user|>", "<|assistant|>"]
    tokenizer = kit.build_jamba_style(
        texts, VOCAB_SIZE, specials, "<|startoftext|>", extra_special=chat, extra_plain=["<|note|>"], limit_alphabet=150,
    )
    config = {
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>", "unk_token": "<|unk|>", "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "spaces_between_special_tokens": False,
    }
    return tokenizer, config, ["<|bom|>", "<|user|>", "<|note|>", "<|endoftext|>"]


def build_metaspace(texts):
    specials = ["<unk>", "<s>", "</s>"]
    vocab, merges = kit.train_bpe(
        kit.spiece_training_texts(texts), VOCAB_SIZE, specials + kit.BYTE_TOKENS,
        kit.spiece_pre_tokenizer_for_training(), limit_alphabet=120,
    )
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=kit.SPIECE_SPACE, prepend_scheme="always", split=True)
    tokenizer.decoder = decoders.Sequence([
        decoders.ByteFallback(), decoders.Metaspace(replacement=kit.SPIECE_SPACE, prepend_scheme="always", split=True),
    ])
    kit.add_tokens(tokenizer, special=specials + ["[INST]", "[/INST]"])
    tokenizer.post_processor = kit.bos_template("<s>", vocab["<s>"])
    return tokenizer, None, ["[INST]", "[/INST]", "</s>"]


def build_bytelevel(texts):
    specials = ["<|endoftext|>", "<|startoftext|>"]
    vocab, merges = kit.train_bpe(
        texts, VOCAB_SIZE, specials,
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), limit_alphabet=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    kit.add_tokens(tokenizer, special=specials + ["<|fim_middle|>"], plain=["<think>", "</think>"])
    tokenizer.post_processor = kit.bos_template("<|startoftext|>", vocab["<|startoftext|>"])
    config = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": True}
    return tokenizer, config, ["<|endoftext|>", "<think>", "<|fim_middle|>"]


BUILDERS = {
    "sp-prepend": ("sentencepiece", build_sp_prepend),
    "sp-jamba": ("sentencepiece", build_sp_jamba),
    "metaspace": ("sentencepiece", build_metaspace),
    "bytelevel": ("byte-level", build_bytelevel),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", default=".carry/demo_corpus.json")
    parser.add_argument("--output", default="tests/fixtures/tokenizers")
    args = parser.parse_args()
    texts = kit.load_corpus(args.corpus, max_chars=TRAINING_CHARS)
    for name, (family, build) in BUILDERS.items():
        tokenizer, config, specials_in_text = build(texts)
        folder = pathlib.Path(args.output) / name
        kit.write_tokenizer(tokenizer, folder, config)
        reloaded = Tokenizer.from_file(str(folder / "tokenizer.json"))
        count = kit.write_cases(reloaded, folder, family, specials_in_text)
        print(f"{name}: vocab {reloaded.get_vocab_size()} (with added tokens), {count} cases", flush=True)


if __name__ == "__main__":
    main()
