package hosts

import (
	"bytes"
	"net/netip"
	"testing"
)

// record is a TLS record of content type typ with n bytes of body.
func record(typ byte, n int) []byte {
	return append([]byte{typ, 3, 3, byte(n >> 8), byte(n)}, bytes.Repeat([]byte{0xaa}, n)...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestClassify: how a stream's start is read, the ways plaintext could
// hide behind a TLS-looking start among them.
func TestClassify(t *testing.T) {
	hello, appData := record(22, 40), record(23, 100)
	sql := []byte("Q\x00\x00\x00\x15SELECT secret;\x00")
	for _, c := range []struct {
		name   string
		seen   bool
		cb, sb []byte
		want   Start
	}{
		{"tls both ways", true, cat(hello, appData), cat(record(22, 90), appData), StartTLS},
		{"tls, the last record cut by the capture", true, cat(hello, appData[:50]), record(22, 90), StartTLS},
		{"tls then plaintext from the client", true, cat(hello, sql), record(22, 90), StartPlain},
		{"tls then plaintext from the server", true, hello, cat(record(22, 90), []byte("DataRow secret")), StartPlain},
		{"sslrequest, S, tls", true, cat(sslRequest, hello, appData), cat([]byte("S"), record(22, 90)), StartPGSSL},
		{"sslrequest, N, plaintext startup", true, cat(sslRequest, []byte{0, 0, 0, 9, 0, 3, 0, 0, 0}), []byte("N"), StartPlain},
		{"sslrequest, S, then plaintext", true, cat(sslRequest, sql), []byte("S"), StartPlain},
		{"sslrequest, then closed", true, sslRequest, []byte("S"), StartPGSSLOnly},
		{"no byte", true, nil, nil, StartEmpty},
		{"plaintext", true, sql, nil, StartPlain},
		{"begun before the capture", false, appData, appData, StartUnseen},
		{"record type out of range", true, cat(hello, []byte{0x47, 3, 3, 0, 1, 0}), record(22, 9), StartPlain},
	} {
		if got := classify(c.seen, c.cb, c.sb); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// The drain's sentinel is a TCP frame parseTCP reads, from and to the
// sentinel address, with its payload intact (Analyze skips it by that
// address).
func TestSentinelFrame(t *testing.T) {
	src, dst, _, _, payload, ok := parseTCP(sentinelFrame([]byte("hello")))
	if !ok || src.Addr() != sentinelAddr || dst.Addr() != sentinelAddr || src.Port() != sentinelPort || string(payload) != "hello" {
		t.Fatalf("parsed %v %v %q ok=%v", src, dst, payload, ok)
	}
	if netip.MustParsePrefix(Subnet).Contains(sentinelAddr) {
		t.Fatal("the sentinel's address is in the hosts' subnet")
	}
}
