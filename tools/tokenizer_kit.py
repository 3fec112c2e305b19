"""Shared helpers for building small BPE tokenizers with HF `tokenizers` and writing their cases.json.

Used by make_tokenizer_fixtures.py (the fixture tokenizers) and train_demo.py (the demo tokenizer).
"""
import json
import pathlib

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPIECE_SPACE = "\u2581"  # "▁", SentencePiece's visible space
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def load_corpus(path, max_chars=None):
    """The JSON list of documents written by prepare_demo_corpus.py, optionally cut to max_chars."""
    documents = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    if max_chars is None:
        return documents
    kept, total = [], 0
    for document in documents:
        if total >= max_chars:
            break
        kept.append(document)
        total += len(document)
    return kept


def _merge_pair(merge):
    # tokenizers serialises merges as ["a", "b"] (newer) or "a b" (older).
    return tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ", 1))


def train_bpe(texts, vocab_size, reserved_tokens, training_pre_tokenizer, limit_alphabet, initial_alphabet=()):
    """Trains BPE merges; returns (vocab, merges) with reserved_tokens at ids 0..len-1.

    The reserved tokens (specials, byte-fallback pieces) go into the model vocab itself, as in a
    SentencePiece conversion, rather than being added tokens that are matched in the text.
    """
    scratch = Tokenizer(models.BPE())
    scratch.pre_tokenizer = training_pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(reserved_tokens),
        limit_alphabet=limit_alphabet,
        initial_alphabet=list(initial_alphabet),
        show_progress=False,
    )
    scratch.train_from_iterator(texts, trainer)
    trained = json.loads(scratch.to_str())["model"]
    vocab = {token: i for i, token in enumerate(reserved_tokens)}
    for token, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    return vocab, [_merge_pair(m) for m in trained["merges"]]


def spiece_training_texts(texts):
    """Texts as SentencePiece sees them: spaces replaced by "▁" (pieces then never cross a word start)."""
    return (t.replace(" ", SPIECE_SPACE) for t in texts)


def spiece_pre_tokenizer_for_training():
    return pre_tokenizers.Metaspace(replacement=SPIECE_SPACE, prepend_scheme="never", split=True)


def add_tokens(tokenizer, special=(), plain=()):
    """Registers special tokens (matched before normalisation, skippable on decode) and plain added tokens."""
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])


def bos_template(bos_token, bos_id):
    return processors.TemplateProcessing(
        single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B", special_tokens=[(bos_token, bos_id)]
    )


def build_jamba_style(texts, vocab_size, specials, bos, extra_special=(), extra_plain=(), limit_alphabet=200):
    """Jamba's own layout: normalizer Replace(" ", "▁") only (no dummy prefix), byte fallback,
    BOS via TemplateProcessing. specials = [pad, bos, eos, unk] at ids 0..3."""
    vocab, merges = train_bpe(
        spiece_training_texts(texts), vocab_size, list(specials) + BYTE_TOKENS,
        spiece_pre_tokenizer_for_training(), limit_alphabet,
    )
    unk = specials[3]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    add_tokens(tokenizer, special=list(specials) + list(extra_special), plain=extra_plain)
    tokenizer.post_processor = bos_template(bos, vocab[bos])
    return tokenizer


def write_tokenizer(tokenizer, folder, tokenizer_config=None):
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")


def case_texts(special_tokens):
    """The strings every cases.json covers; special_tokens are the tokenizer's own (at least two)."""
    first, second = special_tokens[0], special_tokens[1]
    texts = [
        "", " ", "  ", "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading",
        "multiple   spaces   inside", "tab\tseparated\tvalues", "\ttab first", "line one\nline two",
        "\nnewline first", "windows\r\nline\r\nendings", "ends with newline\n", "a\n\n\nb",
        "Café crème brûlée, naïve façade, Ångström, São Paulo", "Ελληνικά: καλημέρα κόσμε",
        "Русский текст: привет, мир", "עברית: שלום עולם", "العربية: مرحبا بالعالم", "हिन्दी: नमस्ते दुनिया",
        "日本語のテキスト、東京タワー", "中文：你好，世界！", "한국어 안녕하세요",
        "Mixed: English, Ελληνικά, Русский, עברית, العربية, हिन्दी, 中文",
        "emoji: 😀 🎉 🚀", "family ZWJ: 👨‍👩‍👧‍👦 and 👩🏽‍💻", "skin tones: 👍🏻 👍🏿 👋🏾",
        "flags 🇩🇪🇯🇵", "zero\u200bwidth\u200bspace", "\ufeffBOM at start", "soft\u00adhyphen and nbsp\u00a0here",
        "control \x01\x02\x7f chars", "bell\x07 and escape\x1b[0m", "12345 67890 3.14159 -42 1e10",
        "2026-11-29 13:50:00 UTC", "Punctuation!?.,;:'\"()[]{}<>@#$%^&*-_=+|\\/~`",
        "a" * 300, " " * 100, "\n" * 20, "ab" * 50, "<0x41> is not a byte token", "<0x41><0xFF>",
        "literal <s> and </s> and <unk>", "rare symbols: ∮ ⊗ ≠ ℵ ₿ ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀",
        f"{first}", f"{first}Hello", f"Hello{first}", f"Hello {first} world", f"{first} {second}",
        f"{first}{second}{first}", f" {first} ", f"text{second}\nmore text", f"{first}{first}",
        "The quick brown fox jumps over the lazy dog.",
        "Debian is a free operating system; apt-get install fortune-mod.",
    ]
    texts += [f"before {token}after" for token in special_tokens[2:]]
    return texts


def encoding_cases(tokenizer, texts):
    cases = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=True).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": tokenizer.encode(text, add_special_tokens=False).ids,
            "decoded": tokenizer.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tokenizer.decode(ids, skip_special_tokens=True),
        })
    return cases


def write_cases(tokenizer, folder, family, special_tokens):
    cases = encoding_cases(tokenizer, case_texts(special_tokens))
    document = {"family": family, "cases": cases}
    path = pathlib.Path(folder) / "cases.json"
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return len(cases)
