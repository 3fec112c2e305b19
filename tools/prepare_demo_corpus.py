#!/usr/bin/env python3
"""Collects the demo model's English training text from installed Debian packages.

Runs on the development machine (where the packages are installed), not on the GPU machine:
  fortunes, fortunes-min   -> /usr/share/games/fortunes/*   (one document per fortune)
  debian-reference-en      -> debian-reference.en.txt.gz    (documents of a few paragraphs)
Writes a JSON list of documents (default .carry/demo_corpus.json) that travels to the GPU machine.
"""
import argparse
import gzip
import json
import pathlib
import re

FORTUNE_DIR = pathlib.Path("/usr/share/games/fortunes")
DEBIAN_REFERENCE = pathlib.Path("/usr/share/debian-reference/debian-reference.en.txt.gz")
SKIPPED_FORTUNE_FILES = {"ascii-art", "art"}  # pictures, not prose
TARGET_DOC_CHARS = 1500


def fortune_documents():
    for path in sorted(FORTUNE_DIR.iterdir()):
        if path.is_dir() or path.suffix in (".dat", ".u8") or path.name in SKIPPED_FORTUNE_FILES:
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        for fortune in re.split(r"^%\n", text, flags=re.M):
            fortune = fortune.strip("\n")
            if fortune.strip():
                yield fortune


def debian_reference_documents():
    with gzip.open(DEBIAN_REFERENCE, "rt", encoding="utf-8", errors="ignore") as f:
        paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", f.read()) if p.strip()]
    document = []
    for paragraph in paragraphs:
        document.append(paragraph)
        if sum(len(p) for p in document) >= TARGET_DOC_CHARS:
            yield "\n\n".join(document)
            document = []
    if document:
        yield "\n\n".join(document)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default=".carry/demo_corpus.json")
    args = parser.parse_args()
    # fortunes-min repeats fortunes from fortunes; keep one copy so held-out text is really unseen.
    documents = list(dict.fromkeys(list(fortune_documents()) + list(debian_reference_documents())))
    output = pathlib.Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(documents, ensure_ascii=False))
    print(f"{len(documents)} documents, {sum(map(len, documents))} characters -> {output}")


if __name__ == "__main__":
    main()
