// Package keystream derives shardvisor's per-user routing keys from a cluster
// seed. It is the routing contract: every client, in every language, must
// reproduce it bit for bit, or rows end up on the wrong shard. The Python
// reference in clients/python/shardvisor/keystream.py and the vectors in
// testdata/vectors.json exist so that ports can check themselves against it.
//
// # Contract (version 1)
//
// All hashing is HKDF (RFC 5869) with SHA-256.
//
//	Salt           = "shardvisor/keystream/v1"                 (23 ASCII bytes)
//	PRK            = HKDF-Extract(salt = Salt, IKM = seed)     (32 bytes)
//	stream(uid, L) = HKDF-Expand(PRK, info = UTF-8(uid), L)    0 <= L <= 8160
//	Prefix64(uid)  = first 8 bytes of stream(uid), big-endian  (uint64)
//	Bucket(uid, n) = top n bits of Prefix64(uid)               0 <= n <= 32
//	               = Prefix64(uid) >> (64 - n) for n >= 1, and 0 for n = 0
//	Key(p)         = int64(p XOR 1<<63)                        (storage encoding)
//
// Porting note: special-case n = 0. A 64-bit shift by 64 is undefined in C
// and C++, a no-op in Java and C# (the count is taken mod 64) and a panic in
// debug Rust; Go happens to give 0. Likewise, the one bucket at level 0 spans
// all 2^64 prefixes, a count that does not fit in a uint64.
//
// The seed is the raw byte string (conventionally written in hex) and must be
// at least [MinSeedLen] bytes long. The user id is used exactly as given: no
// Unicode normalisation, case folding or trimming. (A Go string that is not
// valid UTF-8 is hashed byte for byte, but other languages cannot represent
// it, so such strings must not be used as user ids.) Since HKDF-Expand emits
// T(1) || T(2) || ..., a shorter stream is always a prefix of a longer one,
// so Prefix64 only ever needs T(1) = HMAC-SHA256(PRK, UTF-8(uid) || 0x01).
//
// Buckets nest: Bucket(uid, n+1) is 2*Bucket(uid, n) or 2*Bucket(uid, n)+1,
// so splitting a shard in two means moving to the next level, never
// rehashing.
//
// # Why Key flips the top bit
//
// Prefix64 is stored in a PostgreSQL bigint, which is signed. A plain int64
// conversion would make every prefix >= 1<<63 negative, so the upper half of
// the key space would sort before the lower half: bucket order would not be
// key order, and a run of consecutive buckets that crosses the midpoint (a
// shard owning buckets 1 and 2 at level 2, say) would need two ranges. XOR
// with 1<<63 maps 0 to math.MinInt64 and 1<<64-1 to math.MaxInt64 and is
// strictly increasing, so unsigned order becomes signed order. Every bucket
// at every level, and every run of consecutive buckets, is then exactly one
// inclusive range, "key BETWEEN lo AND hi" with lo and hi from [Range], which
// a B-tree index serves directly, and ranges ascend with the bucket number.
package keystream
