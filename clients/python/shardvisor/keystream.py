"""Reference implementation of the shardvisor keystream routing contract (v1).

This file is the readable specification that ports to other languages
follow. It uses only the Python standard library (hmac, hashlib) and runs on
Python 3.9 or later. The Go package github.com/shardvisor/shardvisor/keystream
implements the same contract; keystream/testdata/vectors.json holds test
vectors that every port must reproduce bit for bit.

Run it as ``python3 -m shardvisor.keystream``.

The contract
------------
All hashing is HKDF (RFC 5869) with SHA-256::

    SALT           = b"shardvisor/keystream/v1"
    PRK            = HKDF-Extract(salt=SALT, IKM=seed)          # 32 bytes
    stream(uid, L) = HKDF-Expand(PRK, info=uid.encode("utf-8"), L)
                     for 0 <= L <= 255 * 32 = 8160
    prefix64(uid)  = int.from_bytes(stream(uid, 8), "big")      # unsigned 64-bit
    bucket(uid, n) = prefix64(uid) >> (64 - n)                  # 0 <= n <= 32
    key(p)         = signed 64-bit value of (p XOR 2**63)        # storage

(Python integers make n = 0 come out as 0 by itself. In C, Java, C#, ... a
64-bit shift by 64 is undefined or a no-op: special-case level 0, whose one
bucket is every prefix.)

* The seed is a byte string of at least 16 bytes, usually written in hex.
* The user id is encoded as UTF-8 exactly as given: no Unicode
  normalisation, no case folding, no trimming. "\\u00e9" and "e\\u0301" are
  different users.
* A shorter stream is always a prefix of a longer one, so prefix64 needs
  only the first HKDF block, T(1) = HMAC-SHA256(PRK, uid_bytes + b"\\x01").
* Buckets nest: bucket(uid, n + 1) is 2 * bucket(uid, n) or that plus 1.
* key() flips the top bit so that unsigned order of prefixes becomes signed
  order of keys in a PostgreSQL bigint column. Every bucket is then one
  inclusive range, ``key BETWEEN lo AND hi``, given by bucket_range().

Command line
------------
::

    python3 -m shardvisor.keystream --seed HEX --level N UID...

prints one line per user id: ``UID<TAB>BUCKET<TAB>PREFIX64``, with BUCKET in
decimal and PREFIX64 as 16 lowercase hex digits (user ids containing tabs or
newlines make that output ambiguous). ::

    python3 -m shardvisor.keystream --vectors FILE

reads a vectors file (the format of keystream/testdata/vectors.json),
recomputes every derived field from each vector's seed and uid and from each
range's level and bucket, and prints the result as JSON. The Go tests use it
to compare this implementation with the Go one.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import sys
from typing import List, Tuple

SALT = b"shardvisor/keystream/v1"
HASH_LEN = 32  # SHA-256 output size
MAX_STREAM_LEN = 255 * HASH_LEN  # the HKDF-Expand limit
MAX_LEVEL = 32
MIN_SEED_LEN = 16


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """RFC 5869 section 2.2: PRK = HMAC-Hash(salt, IKM)."""
    return hmac.new(salt, ikm, hashlib.sha256).digest()


def hkdf_expand(prk: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 section 2.3: T(i) = HMAC-Hash(PRK, T(i-1) | info | i)."""
    if not 0 <= length <= MAX_STREAM_LEN:
        raise ValueError(f"stream length {length} out of range [0, {MAX_STREAM_LEN}]")
    out = b""
    block = b""
    counter = 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def check_level(level: int) -> None:
    """Raise ValueError unless 0 <= level <= MAX_LEVEL."""
    if not 0 <= level <= MAX_LEVEL:
        raise ValueError(f"level {level} out of range [0, {MAX_LEVEL}]")


def parse_seed(text: str) -> bytes:
    """Decode a hex seed, rejecting empty, odd-length, non-hex and short ones."""
    if not text:
        raise ValueError(f"empty seed: want at least {MIN_SEED_LEN} bytes")
    if len(text) % 2:
        raise ValueError(f"seed has an odd number of hex digits ({len(text)})")
    try:
        seed = bytes.fromhex(text)
    except ValueError as e:
        raise ValueError(f"seed is not valid hex: {e}") from None
    if len(seed) < MIN_SEED_LEN:
        raise ValueError(f"seed is {len(seed)} bytes, want at least {MIN_SEED_LEN}")
    return seed


def key(prefix: int) -> int:
    """Storage encoding: the signed 64-bit value of prefix XOR 2**63.

    Python integers are unbounded, so the two's-complement wrap is explicit.
    """
    if not 0 <= prefix < 1 << 64:
        raise ValueError(f"prefix {prefix} is not an unsigned 64-bit value")
    x = prefix ^ (1 << 63)
    return x - (1 << 64) if x >= 1 << 63 else x


def bucket_of(prefix: int, level: int) -> int:
    """The top `level` bits of a 64-bit prefix (0 when level is 0)."""
    check_level(level)
    return prefix >> (64 - level)


def bucket_range(level: int, bucket: int) -> Tuple[int, int]:
    """Inclusive (lo, hi) key bounds of a bucket: lo <= key <= hi."""
    check_level(level)
    if not 0 <= bucket < 1 << level:
        raise ValueError(f"bucket {bucket} out of range for level {level} (want < {1 << level})")
    width = 1 << (64 - level)
    first = bucket * width
    return key(first), key(first + width - 1)


class Keystream:
    """Routing keys for one cluster seed."""

    def __init__(self, seed: bytes):
        if len(seed) < MIN_SEED_LEN:
            raise ValueError(f"seed is {len(seed)} bytes, want at least {MIN_SEED_LEN}")
        self._prk = hkdf_extract(SALT, seed)
        # T(1) is HMAC-SHA256 under the PRK: its inner and outer key blocks
        # are hashed once here, so prefix64 copies two states instead of
        # re-keying (hmac.digest re-keys every call: 2.4x the cost).
        block = self._prk + bytes(64 - len(self._prk))
        self.inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self.outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def stream(self, uid: str, n: int) -> bytes:
        """The first n bytes of HKDF-Expand(PRK, UTF-8(uid), n)."""
        return hkdf_expand(self._prk, uid.encode("utf-8"), n)

    def prefix64(self, uid: str) -> int:
        """The first 8 stream bytes as an unsigned big-endian integer.

        Only T(1) = HMAC(PRK, UTF-8(uid) | 0x01) is needed (see the contract
        above), not the generic expand loop.
        """
        i = self.inner.copy()
        i.update(uid.encode("utf-8") + b"\x01")
        o = self.outer.copy()
        o.update(i.digest())
        return int.from_bytes(o.digest()[:8], "big")

    def bucket(self, uid: str, level: int) -> int:
        """The user's bucket at `level`, in [0, 2**level)."""
        return bucket_of(self.prefix64(uid), level)

    @staticmethod
    def key(prefix: int) -> int:
        return key(prefix)

    @staticmethod
    def bucket_range(level: int, bucket: int) -> Tuple[int, int]:
        return bucket_range(level, bucket)


def recompute_vectors(doc: dict) -> dict:
    """Fill in every derived field of a vectors document from its inputs."""
    levels: List[int] = doc["levels"]
    vectors = []
    for v in doc.get("vectors") or []:
        seed = parse_seed(v["seed"])
        ks = Keystream(seed)
        uid = v["uid"]
        prefix = ks.prefix64(uid)
        vectors.append({
            "seed": seed.hex(),
            "uid": uid,
            "uid_utf8": uid.encode("utf-8").hex(),
            "stream40": ks.stream(uid, 40).hex(),
            "prefix64": f"{prefix:016x}",
            "key": str(key(prefix)),
            "buckets": [bucket_of(prefix, level) for level in levels],
        })
    ranges = []
    for r in doc.get("ranges") or []:
        lo, hi = bucket_range(r["level"], r["bucket"])
        ranges.append({"level": r["level"], "bucket": r["bucket"], "lo": str(lo), "hi": str(hi)})
    return {"contract": SALT.decode("ascii"), "levels": levels, "vectors": vectors, "ranges": ranges}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description="shardvisor keystream v1 reference")
    parser.add_argument("--seed", help="cluster seed, hex (at least 16 bytes)")
    parser.add_argument("--level", type=int, help=f"bucket level, 0..{MAX_LEVEL}")
    parser.add_argument("--vectors", metavar="FILE", help="recompute a vectors file and print it as JSON")
    parser.add_argument("uids", nargs="*", metavar="UID")
    args = parser.parse_args(argv)

    if args.vectors is not None:
        if args.seed is not None or args.level is not None or args.uids:
            parser.error("--vectors takes no other arguments")
        with open(args.vectors, encoding="utf-8") as f:
            doc = json.load(f)
        json.dump(recompute_vectors(doc), sys.stdout, indent=2)  # ASCII-only: \u escapes
        sys.stdout.write("\n")
        return 0

    if args.seed is None or args.level is None:
        parser.error("--seed and --level are required (or use --vectors)")
    try:
        ks = Keystream(parse_seed(args.seed))
        check_level(args.level)
    except ValueError as e:
        parser.error(str(e))
    for uid in args.uids:
        prefix = ks.prefix64(uid)
        sys.stdout.write(f"{uid}\t{bucket_of(prefix, args.level)}\t{prefix:016x}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
