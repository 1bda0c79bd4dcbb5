package keystream

import (
	"bytes"
	stdhkdf "crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/hkdf"
)

// testSeed is a fixed 32-byte seed used where the seed does not matter.
var testSeed = mustHex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func mustNew(t testing.TB, seed []byte) *Keystream {
	t.Helper()
	k, err := New(seed)
	if err != nil {
		t.Fatalf("New(%x): %v", seed, err)
	}
	return k
}

// refStream is the reference: stream(uid) computed with
// golang.org/x/crypto/hkdf, independently of this package's HMAC code.
func refStream(t testing.TB, seed []byte, uid string, n int) []byte {
	t.Helper()
	prk := hkdf.Extract(sha256.New, seed, []byte(Salt))
	out := make([]byte, n)
	if _, err := io.ReadFull(hkdf.Expand(sha256.New, prk, []byte(uid)), out); err != nil {
		t.Fatalf("reference HKDF-Expand(%q, %d): %v", uid, n, err)
	}
	return out
}

// testUIDs covers the cases that break ports: empty, non-ASCII, and the
// lengths around the SHA-256 block boundaries of the inner hash (ipad block,
// then uid || 0x01 || padding: 54 bytes of uid fit one block, 55 do not).
func testUIDs() []string {
	uids := []string{
		"", "a", "alice", "user-42", "USER-42", "user-42 ", " user-42",
		"00000000-0000-0000-0000-000000000000",
		"e\u0301", "\u00e9", // NFD and NFC "é": different bytes, different keys
		"Ñandú", "日本語のユーザー", "emoji-\U0001F600-\U0001F9D1\u200D\U0001F4BB",
		"nul\x00byte", "tab\tnewline\n",
	}
	for _, n := range []int{31, 32, 33, 54, 55, 56, 63, 64, 65, 119, 120, 128, 200, 1000} {
		uids = append(uids, strings.Repeat("x", n))
	}
	// Multi-byte characters straddling a block boundary.
	uids = append(uids, strings.Repeat("é", 40), strings.Repeat("\U0001F600", 50))
	return uids
}

// TestRFC5869Case1 checks that the reference HKDF calls (and the standard
// library's crypto/hkdf, as a second opinion) are used the right way round,
// against RFC 5869 Appendix A.1.
func TestRFC5869Case1(t *testing.T) {
	ikm := mustHex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b")
	salt := mustHex("000102030405060708090a0b0c")
	info := mustHex("f0f1f2f3f4f5f6f7f8f9")
	wantPRK := mustHex("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5")
	wantOKM := mustHex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")

	prk := hkdf.Extract(sha256.New, ikm, salt)
	if !bytes.Equal(prk, wantPRK) {
		t.Errorf("x/crypto Extract = %x, want %x", prk, wantPRK)
	}
	okm := make([]byte, len(wantOKM))
	if _, err := io.ReadFull(hkdf.Expand(sha256.New, prk, info), okm); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(okm, wantOKM) {
		t.Errorf("x/crypto Expand = %x, want %x", okm, wantOKM)
	}
	stdOKM, err := stdhkdf.Key(sha256.New, ikm, salt, string(info), len(wantOKM))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdOKM, wantOKM) {
		t.Errorf("crypto/hkdf Key = %x, want %x", stdOKM, wantOKM)
	}
}

// TestAgainstReference compares Prefix64 and Stream with the reference HKDF
// for several seeds and tricky uids.
func TestAgainstReference(t *testing.T) {
	seeds := [][]byte{
		testSeed,
		bytes.Repeat([]byte{0xff}, MinSeedLen),
		bytes.Repeat([]byte("seed"), 50), // longer than a SHA-256 block
	}
	for _, seed := range seeds {
		k := mustNew(t, seed)
		for _, uid := range testUIDs() {
			want := refStream(t, seed, uid, 100) // crosses into T(4)
			if got, wantP := k.Prefix64(uid), binary.BigEndian.Uint64(want); got != wantP {
				t.Errorf("seed %x uid %q: Prefix64 = %016x, want %016x", seed[:4], uid, got, wantP)
			}
			for _, n := range []int{0, 1, 8, 31, 32, 33, 64, 100} {
				got, err := k.Stream(uid, n)
				if err != nil {
					t.Fatalf("Stream(%q, %d): %v", uid, n, err)
				}
				if !bytes.Equal(got, want[:n]) {
					t.Errorf("seed %x uid %q: Stream(%d) = %x, want %x", seed[:4], uid, n, got, want[:n])
				}
			}
		}
	}
}

// TestAgainstStdlibHKDF cross-checks with crypto/hkdf, whose Expand takes
// info as a string, in case x/crypto and this package shared a mistake.
func TestAgainstStdlibHKDF(t *testing.T) {
	k := mustNew(t, testSeed)
	for _, uid := range testUIDs() {
		want, err := stdhkdf.Key(sha256.New, testSeed, []byte(Salt), uid, 64)
		if err != nil {
			t.Fatal(err)
		}
		got, err := k.Stream(uid, 64)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("uid %q: Stream = %x, crypto/hkdf = %x", uid, got, want)
		}
	}
}

func TestStreamMaxLength(t *testing.T) {
	k := mustNew(t, testSeed)
	uid := "max-length"
	got, err := k.Stream(uid, MaxStreamLen)
	if err != nil {
		t.Fatalf("Stream(%d): %v", MaxStreamLen, err)
	}
	if want := refStream(t, testSeed, uid, MaxStreamLen); !bytes.Equal(got, want) {
		t.Errorf("Stream(%d) differs from reference", MaxStreamLen)
	}
	for _, n := range []int{-1, MaxStreamLen + 1, math.MaxInt} {
		if s, err := k.Stream(uid, n); err == nil {
			t.Errorf("Stream(%d) = %d bytes, want error", n, len(s))
		}
	}
}

func TestStreamPrefixProperty(t *testing.T) {
	k := mustNew(t, testSeed)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		uid := randomUID(rng)
		a, b := rng.IntN(MaxStreamLen+1), rng.IntN(MaxStreamLen+1)
		if a > b {
			a, b = b, a
		}
		sa, err := k.Stream(uid, a)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := k.Stream(uid, b)
		if err != nil {
			t.Fatal(err)
		}
		if len(sa) != a || len(sb) != b {
			t.Fatalf("lengths %d, %d; want %d, %d", len(sa), len(sb), a, b)
		}
		if !bytes.HasPrefix(sb, sa) {
			t.Errorf("uid %q: Stream(%d) is not a prefix of Stream(%d)", uid, a, b)
		}
		if b >= 8 && binary.BigEndian.Uint64(sb) != k.Prefix64(uid) {
			t.Errorf("uid %q: Prefix64 is not the first 8 bytes of the stream", uid)
		}
	}
}

// randomUID returns a random string of up to 150 bytes mixing ASCII and
// multi-byte characters. It is always valid UTF-8, like real user ids.
func randomUID(rng *rand.Rand) string {
	alphabet := []rune("abcXYZ019-_.@ é日\U0001F600\u0301")
	var sb strings.Builder
	for n := rng.IntN(60); n > 0; n-- {
		sb.WriteRune(alphabet[rng.IntN(len(alphabet))])
	}
	return sb.String()
}

func TestBucketNesting(t *testing.T) {
	k := mustNew(t, testSeed)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		uid := randomUID(rng)
		if b := k.Bucket(uid, 0); b != 0 {
			t.Fatalf("uid %q: Bucket(0) = %d, want 0", uid, b)
		}
		for n := range MaxLevel {
			parent, child := k.Bucket(uid, n), k.Bucket(uid, n+1)
			if child>>1 != parent {
				t.Fatalf("uid %q: Bucket(%d) = %d is not a child of Bucket(%d) = %d", uid, n+1, child, n, parent)
			}
		}
		if b32, p := k.Bucket(uid, 32), k.Prefix64(uid); uint64(b32) != p>>32 {
			t.Fatalf("uid %q: Bucket(32) = %08x, want top half of %016x", uid, b32, p)
		}
	}
}

func TestBucketOf(t *testing.T) {
	const p = 0xdeadbeefcafef00d
	cases := []struct {
		level int
		want  uint32
	}{
		{0, 0}, {1, 1}, {4, 0xd}, {8, 0xde}, {16, 0xdead}, {31, 0xdeadbeef >> 1}, {32, 0xdeadbeef},
	}
	for _, c := range cases {
		if got := BucketOf(p, c.level); got != c.want {
			t.Errorf("BucketOf(%x, %d) = %x, want %x", uint64(p), c.level, got, c.want)
		}
	}
	if got := BucketOf(math.MaxUint64, 32); got != math.MaxUint32 {
		t.Errorf("BucketOf(max, 32) = %x", got)
	}
}

func TestBucketInvalidLevelPanics(t *testing.T) {
	k := mustNew(t, testSeed)
	for _, level := range []int{-1, MaxLevel + 1, 64, 65} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Bucket(uid, %d) did not panic", level)
				}
			}()
			k.Bucket("uid", level)
		}()
		if err := CheckLevel(level); err == nil {
			t.Errorf("CheckLevel(%d) = nil, want error", level)
		}
	}
	for level := 0; level <= MaxLevel; level++ {
		if err := CheckLevel(level); err != nil {
			t.Errorf("CheckLevel(%d) = %v", level, err)
		}
	}
}

func TestKeyOrderPreserving(t *testing.T) {
	edges := []uint64{0, 1, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64 - 1, math.MaxUint64}
	want := []int64{math.MinInt64, math.MinInt64 + 1, -1, 0, 1, math.MaxInt64 - 1, math.MaxInt64}
	for i, p := range edges {
		if got := Key(p); got != want[i] {
			t.Errorf("Key(%016x) = %d, want %d", p, got, want[i])
		}
		if back := PrefixFromKey(Key(p)); back != p {
			t.Errorf("PrefixFromKey(Key(%016x)) = %016x", p, back)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	vals := append([]uint64{}, edges...)
	for range 2000 {
		vals = append(vals, rng.Uint64())
	}
	for range 2000 {
		u1, u2 := vals[rng.IntN(len(vals))], vals[rng.IntN(len(vals))]
		if (u1 < u2) != (Key(u1) < Key(u2)) || (u1 == u2) != (Key(u1) == Key(u2)) {
			t.Fatalf("order not preserved: %016x vs %016x gave %d vs %d", u1, u2, Key(u1), Key(u2))
		}
	}
}

func TestRangeExact(t *testing.T) {
	cases := []struct {
		level  int
		bucket uint32
		lo, hi int64
	}{
		{0, 0, math.MinInt64, math.MaxInt64},
		{1, 0, math.MinInt64, -1},
		{1, 1, 0, math.MaxInt64},
		{2, 1, math.MinInt64 / 2, -1},
		{2, 2, 0, math.MaxInt64 / 2},
		{32, 0, math.MinInt64, math.MinInt64 + 1<<32 - 1},
		{32, 1 << 31, 0, 1<<32 - 1},
		{32, math.MaxUint32, math.MaxInt64 - (1<<32 - 1), math.MaxInt64},
		{32, 0xdeadbeef, Key(0xdeadbeef00000000), Key(0xdeadbeefffffffff)},
	}
	for _, c := range cases {
		lo, hi, err := Range(c.level, c.bucket)
		if err != nil {
			t.Errorf("Range(%d, %d): %v", c.level, c.bucket, err)
			continue
		}
		if lo != c.lo || hi != c.hi {
			t.Errorf("Range(%d, %d) = [%d, %d], want [%d, %d]", c.level, c.bucket, lo, hi, c.lo, c.hi)
		}
	}
}

// TestRangeTiles checks that at every level the ranges of consecutive
// buckets are adjacent, so together they cover the int64 line exactly once.
func TestRangeTiles(t *testing.T) {
	for level := 0; level <= MaxLevel; level++ {
		n := uint64(1) << level
		// Checking every bucket at level 32 is 4 billion ranges; the edges
		// and a sample are enough.
		buckets := []uint64{0, n / 2, n - 1}
		if n <= 1024 {
			buckets = buckets[:0]
			for b := range n {
				buckets = append(buckets, b)
			}
		}
		for _, b := range buckets {
			lo, hi, err := Range(level, uint32(b))
			if err != nil {
				t.Fatalf("Range(%d, %d): %v", level, b, err)
			}
			if b == 0 && lo != math.MinInt64 {
				t.Errorf("Range(%d, 0) lo = %d, want MinInt64", level, lo)
			}
			if b == n-1 && hi != math.MaxInt64 {
				t.Errorf("Range(%d, %d) hi = %d, want MaxInt64", level, b, hi)
			}
			if size := uint64(hi-lo) + 1; size != (math.MaxUint64>>level)+1 {
				t.Errorf("Range(%d, %d) spans %d keys", level, b, size)
			}
			if b+1 < n {
				nlo, _, err := Range(level, uint32(b+1))
				if err != nil {
					t.Fatal(err)
				}
				if nlo != hi+1 {
					t.Errorf("level %d: bucket %d ends at %d but bucket %d starts at %d", level, b, hi, b+1, nlo)
				}
			}
		}
	}
}

func TestRangeErrors(t *testing.T) {
	cases := []struct {
		level  int
		bucket uint32
	}{
		{-1, 0}, {MaxLevel + 1, 0}, {64, 0},
		{0, 1}, {1, 2}, {8, 256}, {31, 1 << 31},
	}
	for _, c := range cases {
		if lo, hi, err := Range(c.level, c.bucket); err == nil {
			t.Errorf("Range(%d, %d) = [%d, %d], want error", c.level, c.bucket, lo, hi)
		}
	}
}

// TestKeyInBucketRange is the property the storage layer relies on: a
// user's key lies in its bucket's range, at every level, and in no other
// bucket's range at that level.
func TestKeyInBucketRange(t *testing.T) {
	k := mustNew(t, testSeed)
	rng := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		uid := randomUID(rng)
		level := rng.IntN(MaxLevel + 1)
		key := Key(k.Prefix64(uid))
		b := k.Bucket(uid, level)
		lo, hi, err := Range(level, b)
		if err != nil {
			t.Fatal(err)
		}
		if key < lo || key > hi {
			t.Fatalf("uid %q level %d: key %d outside bucket %d range [%d, %d]", uid, level, key, b, lo, hi)
		}
		// The neighbouring buckets must not contain it.
		for _, nb := range []int64{int64(b) - 1, int64(b) + 1} {
			if nb < 0 || nb >= 1<<level {
				continue
			}
			nlo, nhi, err := Range(level, uint32(nb))
			if err != nil {
				t.Fatal(err)
			}
			if key >= nlo && key <= nhi {
				t.Fatalf("uid %q level %d: key %d also in bucket %d", uid, level, key, nb)
			}
		}
	}
}

func TestParseSeed(t *testing.T) {
	good := "000102030405060708090A0B0C0D0E0F"
	s, err := ParseSeed(good)
	if err != nil {
		t.Fatalf("ParseSeed(%q): %v", good, err)
	}
	if got := s.String(); got != strings.ToLower(good) {
		t.Errorf("String() = %q, want %q", got, strings.ToLower(good))
	}
	bad := []struct{ in, wantMsg string }{
		{"", "empty seed"},
		{"abc", "odd number"},
		{"zz0102030405060708090a0b0c0d0e0f", "not valid hex"},
		{"00010203", "seed is 4 bytes, want at least 16"},
		{strings.Repeat("ab", MinSeedLen-1), "seed is 15 bytes"},
	}
	for _, c := range bad {
		_, err := ParseSeed(c.in)
		if err == nil || !strings.Contains(err.Error(), c.wantMsg) {
			t.Errorf("ParseSeed(%q) error = %v, want it to mention %q", c.in, err, c.wantMsg)
		}
	}
}

func TestNewRejectsShortSeed(t *testing.T) {
	for _, n := range []int{0, 1, MinSeedLen - 1} {
		_, err := New(make([]byte, n))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("seed is %d bytes", n)) {
			t.Errorf("New(%d bytes) error = %v, want a length error", n, err)
		}
	}
	if _, err := New(make([]byte, MinSeedLen)); err != nil {
		t.Errorf("New(%d bytes): %v", MinSeedLen, err)
	}
}

// TestSeedsDiffer guards against the seed being ignored (for example the
// salt and IKM swapped into a constant key).
func TestSeedsDiffer(t *testing.T) {
	a := mustNew(t, testSeed)
	other := bytes.Clone(testSeed)
	other[len(other)-1] ^= 1
	b := mustNew(t, other)
	same := 0
	for _, uid := range testUIDs() {
		if a.Prefix64(uid) == b.Prefix64(uid) {
			same++
		}
	}
	if same > 0 {
		t.Errorf("%d uids got the same prefix under different seeds", same)
	}
}

func TestPrefix64ZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	k := mustNew(t, testSeed)
	for _, uid := range []string{"", "user-42", strings.Repeat("x", 200)} {
		if n := testing.AllocsPerRun(1000, func() { sinkU64 = k.Prefix64(uid) }); n != 0 {
			t.Errorf("Prefix64(%d-byte uid) allocates %v times per call", len(uid), n)
		}
		if n := testing.AllocsPerRun(1000, func() { _ = k.Bucket(uid, 16) }); n != 0 {
			t.Errorf("Bucket(%d-byte uid) allocates %v times per call", len(uid), n)
		}
	}
}

// TestConcurrentPrefix64 hammers one Keystream from many goroutines; run it
// with -race. Each goroutine checks its results against values computed
// serially beforehand, so interference between pooled states would show up
// as wrong answers even without the race detector.
func TestConcurrentPrefix64(t *testing.T) {
	k := mustNew(t, testSeed)
	uids := testUIDs()
	want := make([]uint64, len(uids))
	for i, uid := range uids {
		want[i] = binary.BigEndian.Uint64(refStream(t, testSeed, uid, 8))
	}
	const goroutines = 32
	iters := 300
	if testing.Short() {
		iters = 30
	}
	var wg sync.WaitGroup
	errs := make(chan string, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range iters {
				j := (g + i) % len(uids)
				if got := k.Prefix64(uids[j]); got != want[j] {
					errs <- fmt.Sprintf("goroutine %d: Prefix64(%q) = %016x, want %016x", g, uids[j], got, want[j])
					return
				}
				if i%50 == 0 { // mix in Stream, which shares the pool
					s, err := k.Stream(uids[j], 40)
					if err != nil || binary.BigEndian.Uint64(s) != want[j] {
						errs <- fmt.Sprintf("goroutine %d: Stream(%q) = %x, %v", g, uids[j], s, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// FuzzPrefix64 compares the fast path with the reference HKDF for arbitrary
// uids (including invalid UTF-8: the contract hashes the bytes as given) and
// seeds.
func FuzzPrefix64(f *testing.F) {
	for _, uid := range testUIDs() {
		f.Add(uid, testSeed)
	}
	f.Add("user-42", bytes.Repeat([]byte{0}, MinSeedLen))
	f.Add("\xff\xfe", bytes.Repeat([]byte("long seed "), 20))
	f.Fuzz(func(t *testing.T, uid string, seed []byte) {
		k, err := New(seed)
		if len(seed) < MinSeedLen {
			if err == nil {
				t.Fatalf("New accepted a %d-byte seed", len(seed))
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		want := refStream(t, seed, uid, 40)
		if got := k.Prefix64(uid); got != binary.BigEndian.Uint64(want) {
			t.Fatalf("Prefix64(%q) = %016x, reference %x", uid, got, want[:8])
		}
		s, err := k.Stream(uid, 40)
		if err != nil || !bytes.Equal(s, want) {
			t.Fatalf("Stream(%q, 40) = %x, %v; reference %x", uid, s, err, want)
		}
	})
}
