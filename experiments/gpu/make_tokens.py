#!/usr/bin/env python3
"""Write an llm.c-format uint16 token file for THROUGHPUT BENCHMARKS ONLY.

The ids are NOT a tokenization: this is not GPT-2's (or any) tokenizer. Each
id is a hash of a pair of consecutive bytes of the input text, folded into
[0, V). The file therefore has the vocabulary size a model needs (e.g. 50257
for gpt2-124m, which refuses byte data), and a step on it costs what a step on
real tokens costs (the cost does not depend on the ids), but a loss trained on
it means nothing about language modelling. Use real tokenized data (llm.c's
dev/data/*.py, or Megatron-LM's tools/preprocess_data.py) to train.

Format (llm.c dev/data/data_common.py): a header of 256 little-endian int32,
header[0] = 20240520 (magic), header[1] = 1 (version: uint16 ids),
header[2] = N (token count), then N little-endian uint16 ids.

The mapping is deterministic: the same text, N and V give the same file.
With P = L // 2 byte pairs in a text of L bytes, token i hashes pair
k = i mod P (bytes 2k and 2k+1) with the pass number i // P, so a text shorter
than 2N bytes is reused without repeating the same ids.

Usage: make_tokens.py TEXT OUT --tokens N --vocab V
e.g.   make_tokens.py README.md /tmp/gpt2-tokens.bin --tokens 10000000 --vocab 50257
then   meshtrain train --model gpt2-124m --data /tmp/gpt2-tokens.bin ...
"""

import argparse
import array
import struct
import sys

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256


def pair_id(a, b, rep, vocab):
    """A fixed 32-bit mix (FNV-1a style) of two bytes and the pass number, in [0, vocab)."""
    h = 2166136261
    for byte in (a, b, rep & 0xFF, (rep >> 8) & 0xFF):
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h % vocab


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("text", help="any file; its bytes seed the ids")
    p.add_argument("out", help="the llm.c token file to write")
    p.add_argument("--tokens", type=int, required=True, help="N, the number of ids")
    p.add_argument("--vocab", type=int, required=True, help="V: ids are in [0, V); at most 65536 (uint16)")
    args = p.parse_args(argv)
    if not 1 <= args.vocab <= 65536:
        p.error(f"--vocab {args.vocab} must be in 1..65536: the file holds uint16 ids")
    if not 1 <= args.tokens < 2**31:
        p.error(f"--tokens {args.tokens} must be in 1..2^31-1: the header holds an int32 count")
    with open(args.text, "rb") as f:
        text = f.read()
    if len(text) < 2:
        p.error(f"'{args.text}' has {len(text)} bytes; it needs at least 2")

    # The pairs' ids of one pass, computed once per pass (cheap for short texts, linear overall).
    pairs = len(text) // 2
    ids = array.array("H")
    rep = 0
    while len(ids) < args.tokens:
        take = min(pairs, args.tokens - len(ids))
        ids.extend(pair_id(text[2 * k], text[2 * k + 1], rep, args.vocab) for k in range(take))
        rep += 1
    if sys.byteorder != "little":
        ids.byteswap()

    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, args.tokens
    with open(args.out, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(ids.tobytes())
    print(f"wrote {args.tokens:,} ids in [0, {args.vocab}) to {args.out} "
          f"({4 * HEADER_INTS + 2 * args.tokens:,} bytes; for throughput only, not a tokenization)")


if __name__ == "__main__":
    main(sys.argv[1:])
