package keystream

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"sync"
)

const (
	// Salt is the HKDF-Extract salt. The version suffix is part of the
	// contract: a different derivation must use a different salt.
	Salt = "shardvisor/keystream/v1"

	// MaxLevel is the deepest bucket level: buckets are at most 32 bits.
	MaxLevel = 32

	// MaxStreamLen is the longest stream HKDF-Expand can produce with
	// SHA-256 (255 blocks of 32 bytes).
	MaxStreamLen = 255 * sha256.Size

	// MinSeedLen is the shortest accepted cluster seed, in bytes. HKDF
	// itself accepts any length; the limit keeps out placeholder seeds such
	// as "00", and where the seed is kept from whoever chooses user ids,
	// 128 bits stops them guessing it and aiming ids at one bucket.
	MinSeedLen = 16
)

// Seed is a cluster seed: the HKDF input keying material. Its textual form
// is lowercase hex.
type Seed []byte

// ParseSeed decodes a hex-encoded seed (either case). It rejects an empty
// string, an odd number of digits, non-hex characters and seeds shorter than
// MinSeedLen bytes.
func ParseSeed(s string) (Seed, error) {
	if s == "" {
		return nil, fmt.Errorf("keystream: empty seed: want at least %d bytes (%d hex digits)", MinSeedLen, 2*MinSeedLen)
	}
	if len(s)%2 != 0 {
		return nil, fmt.Errorf("keystream: seed has an odd number of hex digits (%d)", len(s))
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("keystream: seed is not valid hex: %w", err)
	}
	if err := checkSeedLen(len(b)); err != nil {
		return nil, err
	}
	return Seed(b), nil
}

// String returns the seed as lowercase hex, the form ParseSeed accepts.
func (s Seed) String() string { return hex.EncodeToString(s) }

func checkSeedLen(n int) error {
	if n < MinSeedLen {
		return fmt.Errorf("keystream: seed is %d bytes, want at least %d", n, MinSeedLen)
	}
	return nil
}

// CheckLevel reports whether level is a valid bucket level (0..MaxLevel).
// Use it to validate configuration once, so the hot path (Bucket) need not
// return an error.
func CheckLevel(level int) error {
	if level < 0 || level > MaxLevel {
		return fmt.Errorf("keystream: level %d out of range [0, %d]", level, MaxLevel)
	}
	return nil
}

// Keystream derives streams, prefixes and buckets for one cluster seed. It
// is safe for concurrent use by multiple goroutines.
type Keystream struct {
	// innerState and outerState are marshaled SHA-256 states that have
	// already absorbed the HMAC ipad and opad blocks for the PRK. Restoring
	// them saves two of the four compressions of a naive HMAC per block.
	// They are read-only after New.
	innerState, outerState []byte

	// pool holds *hmacState scratch objects: a hash.Hash cannot be shared
	// between goroutines, and allocating one per call would cost an
	// allocation.
	pool sync.Pool
}

// hmacState is per-call scratch space. Keeping the buffers here (rather than
// on the stack) is what makes Prefix64 allocation-free: anything passed to
// a hash.Hash method escapes.
type hmacState struct {
	inner, outer       hash.Hash
	innerRst, outerRst encoding.BinaryUnmarshaler
	buf                [sha256.BlockSize]byte
	sum                [sha256.Size]byte
}

// New derives the PRK from seed and precomputes the HMAC state. The seed
// must be at least MinSeedLen bytes; it is not retained.
func New(seed []byte) (*Keystream, error) {
	if err := checkSeedLen(len(seed)); err != nil {
		return nil, err
	}
	// HKDF-Extract is exactly HMAC(salt, IKM); it runs once per Keystream.
	ext := hmac.New(sha256.New, []byte(Salt))
	ext.Write(seed)
	prk := ext.Sum(nil)

	// HMAC with a 32-byte key: the key is zero-padded to one block and
	// XORed with 0x36 (inner) and 0x5c (outer).
	var ipad, opad [sha256.BlockSize]byte
	copy(ipad[:], prk)
	copy(opad[:], prk)
	for i := range ipad {
		ipad[i] ^= 0x36
		opad[i] ^= 0x5c
	}
	k := &Keystream{}
	var err error
	if k.innerState, err = absorbed(ipad[:]); err != nil {
		return nil, err
	}
	if k.outerState, err = absorbed(opad[:]); err != nil {
		return nil, err
	}
	clear(prk)
	clear(ipad[:])
	clear(opad[:])
	first, err := newHMACState()
	if err != nil {
		return nil, err
	}
	k.pool.New = func() any {
		s, err := newHMACState()
		if err != nil {
			panic(err) // newHMACState succeeded once in New; it cannot fail now
		}
		return s
	}
	k.pool.Put(first)
	return k, nil
}

func newHMACState() (*hmacState, error) {
	s := &hmacState{inner: sha256.New(), outer: sha256.New()}
	var ok1, ok2 bool
	s.innerRst, ok1 = s.inner.(encoding.BinaryUnmarshaler)
	s.outerRst, ok2 = s.outer.(encoding.BinaryUnmarshaler)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("keystream: sha256 digest %T cannot restore its state", s.inner)
	}
	return s, nil
}

// absorbed returns the marshaled SHA-256 state after hashing block.
func absorbed(block []byte) ([]byte, error) {
	h := sha256.New()
	h.Write(block)
	m, ok := h.(encoding.BinaryMarshaler)
	if !ok {
		return nil, fmt.Errorf("keystream: sha256 digest %T cannot export its state", h)
	}
	return m.MarshalBinary()
}

func (k *Keystream) get() *hmacState { return k.pool.Get().(*hmacState) }

func (k *Keystream) put(s *hmacState) { k.pool.Put(s) }

// block computes T(i) = HMAC(PRK, prev || uid || i) into s.sum and returns
// it. prev is T(i-1), empty for i = 1.
func (k *Keystream) block(s *hmacState, prev []byte, uid string, i byte) []byte {
	// UnmarshalBinary only fails on a malformed state, which New produced
	// from the same implementation.
	if err := s.innerRst.UnmarshalBinary(k.innerState); err != nil {
		panic("keystream: restoring SHA-256 state: " + err.Error())
	}
	s.inner.Write(prev)
	// Copy the uid through buf, since converting a string to []byte for an
	// interface call allocates. The counter byte rides along with the last
	// chunk when it fits, saving a Write.
	for len(uid) >= len(s.buf) {
		n := copy(s.buf[:], uid)
		s.inner.Write(s.buf[:n])
		uid = uid[n:]
	}
	n := copy(s.buf[:], uid)
	s.buf[n] = i
	s.inner.Write(s.buf[:n+1])
	innerSum := s.inner.Sum(s.sum[:0])

	if err := s.outerRst.UnmarshalBinary(k.outerState); err != nil {
		panic("keystream: restoring SHA-256 state: " + err.Error())
	}
	s.outer.Write(innerSum)
	return s.outer.Sum(s.sum[:0])
}

// Prefix64 returns the first 8 bytes of stream(uid) as a big-endian uint64.
// This is the hot path: one HMAC block over precomputed state, no
// allocations.
func (k *Keystream) Prefix64(uid string) uint64 {
	s := k.get()
	p := binary.BigEndian.Uint64(k.block(s, nil, uid, 1))
	k.put(s)
	return p
}

// Stream returns the first n bytes of stream(uid) = HKDF-Expand(PRK,
// UTF-8(uid), n). It returns an error if n is negative or exceeds
// MaxStreamLen. Stream(uid, a) is a prefix of Stream(uid, b) for a <= b.
func (k *Keystream) Stream(uid string, n int) ([]byte, error) {
	if n < 0 || n > MaxStreamLen {
		return nil, fmt.Errorf("keystream: stream length %d out of range [0, %d]", n, MaxStreamLen)
	}
	out := make([]byte, 0, n)
	s := k.get()
	defer k.put(s)
	var prev []byte // T(i-1), kept as a view of out
	for i := 1; len(out) < n; i++ {
		start := len(out)
		t := k.block(s, prev, uid, byte(i))
		out = append(out, t[:min(len(t), n-start)]...)
		prev = out[start:] // short only on the last block, when it is unused
	}
	return out, nil
}

// Bucket returns the top level bits of Prefix64(uid), a number in
// [0, 2^level). Level 0 always gives bucket 0. Bucket panics if level is
// outside [0, MaxLevel], like an out-of-range index; validate untrusted
// levels with CheckLevel first.
func (k *Keystream) Bucket(uid string, level int) uint32 {
	return BucketOf(k.Prefix64(uid), level)
}

// BucketOf returns the bucket of a prefix at the given level: its top level
// bits. It panics if level is outside [0, MaxLevel] (see CheckLevel).
func BucketOf(prefix uint64, level int) uint32 {
	if err := CheckLevel(level); err != nil {
		panic(err)
	}
	// In Go, x >> 64 is 0, which is exactly the level-0 bucket.
	return uint32(prefix >> (64 - level))
}

// Key encodes a prefix for a signed 64-bit column (PostgreSQL bigint) by
// flipping the top bit, so that unsigned order on prefixes is signed order
// on keys. See the package documentation.
func Key(prefix uint64) int64 { return int64(prefix ^ 1<<63) }

// PrefixFromKey is the inverse of Key.
func PrefixFromKey(key int64) uint64 { return uint64(key) ^ 1<<63 }

// Range returns the inclusive bounds of the keys (see Key) whose bucket at
// level is bucket: a row belongs to it iff lo <= key <= hi. It returns an
// error if level is outside [0, MaxLevel] or bucket >= 2^level.
func Range(level int, bucket uint32) (lo, hi int64, err error) {
	if err := CheckLevel(level); err != nil {
		return 0, 0, err
	}
	if uint64(bucket) >= 1<<level {
		return 0, 0, fmt.Errorf("keystream: bucket %d out of range for level %d (want < %d)", bucket, level, uint64(1)<<level)
	}
	// The bucket fixes the top level bits; the remaining bits run from all
	// zeros to all ones. For level 0, bucket<<64 is 0 and span is all ones.
	first := uint64(bucket) << (64 - level)
	span := ^uint64(0) >> level
	return Key(first), Key(first | span), nil
}
