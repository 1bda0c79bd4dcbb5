package bucketmap

import (
	"strings"
	"testing"
)

// at is bucket n at the map's level: how tests of maps at one depth name
// buckets.
func at(m *Map, n uint32) Bucket { return Bucket{n, m.Level} }

// badNode is a change to a valid node that ValidateNode must refuse with
// an error containing errHas.
type badNode struct {
	mut    func(*Node)
	errHas string
}

// wantInvalidNodes applies each case's change to a copy of good and wants
// ValidateNode to refuse it with the case's error, which never contains
// the password the cases use (hunter2).
func wantInvalidNodes(t *testing.T, good Node, cases []badNode) {
	t.Helper()
	for _, tc := range cases {
		n := good
		tc.mut(&n)
		err := ValidateNode(n)
		if err == nil || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("%+v: %v, want %q", n, err, tc.errHas)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// eachEncoding sets m's encoding to each one in turn, encodes m, decodes
// the record and hands both to check; what names m in messages.
func eachEncoding(t *testing.T, what string, m *Map, check func(enc MapEncoding, data []byte, back *Map)) {
	t.Helper()
	for _, enc := range []MapEncoding{MapPlain, MapGzip} {
		m.Encoding = enc
		data, err := Encode(m)
		if err != nil {
			t.Fatalf("%s, %s: %v", what, enc, err)
		}
		back, err := Decode("/m", data)
		if err != nil {
			t.Fatalf("%s, %s: %v", what, enc, err)
		}
		check(enc, data, back)
	}
}
