package bucketmap

import (
	"bytes"
	"compress/gzip"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/shardvisor/shardvisor/internal/testkit"
	"github.com/shardvisor/shardvisor/topo"
)

const mapJSON = `{"version":1,"map_version":3,"level":0,"updated_at":"2026-01-02T03:04:05Z","nodes":[{"id":"n1","dsn":"postgres://h/d","weight":1,"state":"active"}],"owners":"AAA="}`

func gz(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Both forms unpack to the same JSON; the plain one is handed back as it
// is, and each says how it was stored.
func TestMapRecordEncodings(t *testing.T) {
	plain, err := PackMapRecord([]byte(mapJSON), MapPlain)
	if err != nil || string(plain) != mapJSON {
		t.Fatalf("plain pack changed the JSON: %q %v", plain, err)
	}
	if def, _ := PackMapRecord([]byte(mapJSON), ""); string(def) != mapJSON {
		t.Fatal(`encoding "" is not plain`)
	}
	packed, err := PackMapRecord([]byte(mapJSON), MapGzip)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(packed, []byte{0x1f, 0x8b}) {
		t.Fatalf("gzip record does not start with the gzip magic: % x", packed[:4])
	}
	for _, tc := range []struct {
		data []byte
		enc  MapEncoding
	}{{plain, MapPlain}, {packed, MapGzip}, {gz(t, []byte(mapJSON)), MapGzip}} {
		js, enc, err := UnpackMapRecord("/m", tc.data)
		if err != nil || enc != tc.enc || string(js) != mapJSON {
			t.Fatalf("unpack %s: %q %s %v", tc.enc, js, enc, err)
		}
		r, err := DecodeMapRecord("/m", tc.data)
		if err != nil || r.MapVersion != 3 || r.Owners != "AAA=" {
			t.Fatalf("DecodeMapRecord of the %s form: %+v %v", tc.enc, r, err)
		}
	}
	if _, err := PackMapRecord([]byte(mapJSON), "zstd"); err == nil {
		t.Fatal("unknown encoding accepted")
	}
	if _, err := PackMapRecord(make([]byte, MaxMapJSON+1), MapGzip); err == nil || !strings.Contains(err.Error(), "plain form") {
		t.Fatalf("JSON over the znode limit packed: %v", err)
	}
	for _, s := range []string{"plain", "gzip"} {
		if e, err := ParseMapEncoding(s); err != nil || string(e) != s {
			t.Fatalf("ParseMapEncoding(%s): %s %v", s, e, err)
		}
	}
	if _, err := ParseMapEncoding("GZIP"); err == nil {
		t.Fatal("ParseMapEncoding accepted GZIP")
	}
}

// A damaged compressed record is refused with an error that names the
// znode and says what is wrong, never half-read.
func TestMapRecordCorruptCompressed(t *testing.T) {
	good := gz(t, []byte(mapJSON))
	flipped := bytes.Clone(good)
	flipped[len(flipped)-12] ^= 0xff // in the deflate data, before the CRC-32 and length
	badCRC := bytes.Clone(good)
	badCRC[len(badCRC)-8] ^= 0xff
	bomb := gz(t, make([]byte, MaxMapJSON+1))
	cases := []testkit.Malformed{
		{string(good[:len(good)-4]), "truncated"},
		{string(good[:5]), "gzip-compressed record: truncated (5 bytes stored)"},
		{string(append([]byte{0x1f, 0x8b, 99}, good[3:]...)), "corrupt: gzip: invalid header"},
		{string(flipped), "corrupt"},
		{string(badCRC), "corrupt: gzip: invalid checksum"},
		{string(append(bytes.Clone(good), good...)), "trailing data after the compressed stream"},
		{string(append(bytes.Clone(good), 0)), "1 bytes of trailing data"},
		{string(bomb), "inflates to more than"},
		{string(gz(t, []byte("not json"))), "not JSON"},
		{string(gz(t, nil)), "empty"},
	}
	unpack := func(znode string, data []byte) ([]byte, error) {
		js, _, err := UnpackMapRecord(znode, data)
		if err == nil {
			_, err = DecodeMapRecord(znode, js)
		}
		return js, err
	}
	testkit.WantMalformed(t, topo.ErrMalformed, "UnpackMapRecord", unpack, "bucket map", "/shardvisor/c1/map", cases)
	testkit.WantMalformed(t, topo.ErrMalformed, "DecodeMapRecord", DecodeMapRecord, "bucket map", "/shardvisor/c1/map", cases)
	// Not a gzip stream at all is a JSON error, as before compression.
	if _, err := DecodeMapRecord("/m", []byte{0x1f, 'x'}); err == nil || !strings.Contains(err.Error(), "not JSON") || !errors.Is(err, topo.ErrMalformed) {
		t.Fatalf("half a magic: %v", err)
	}
}

// DecodeMapRecord's one-pass path for good records accepts exactly what
// the generic strict decoder accepts, and the same record; a record it
// refuses gets the generic decoder's error.
func FuzzDecodeMapRecordAgrees(f *testing.F) {
	for _, s := range []string{
		mapJSON,
		" " + mapJSON + "\n",
		mapJSON + " {}",
		mapJSON + "x",
		`{"version":2,"map_version":3,"level":0,"nodes":[],"owners":"AAA="}`,
		`{"version":null,"map_version":3}`,
		`{"map_version":3}`,
		`{"version":1,"extra":1}`,
		`{"Version":1,"MAP_VERSION":4,"owners":""}`,
		`{"version":1,"version":0}`,
		`{"version":1,"level":"x"}`,
		`[1]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if bytes.HasPrefix(data, gzipMagic) {
			return // the JSON inside is what is compared
		}
		got, err := DecodeMapRecord("/m", data)
		var want *MapRecord
		var r MapRecord
		werr := topo.Decode("bucket map", "/m", data, MapFormatVersion, &r)
		if werr == nil {
			want = &r
		}
		if (err == nil) != (werr == nil) || err != nil && err.Error() != werr.Error() {
			t.Fatalf("DecodeMapRecord: %v; the generic decoder: %v", err, werr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeMapRecord gave %+v, the generic decoder %+v", got, want)
		}
	})
}
