package testkit

import (
	"errors"
	"strings"
	"testing"
)

// Malformed is a record (its first element) that its decoder must refuse
// with an error containing the second: {data, errHas}.
type Malformed [2]string

// WantMalformed checks, for the tests of topo's and bucketmap's decoders,
// that malformed records are refused in the one way records promise: it
// decodes each case as the record at path with decode (called name in
// messages) and wants an error that contains the case's errHas, wraps
// sentinel (topo.ErrMalformed: an argument, so that topo's own tests can
// use it) and names the record and path ("<record> at <path>").
func WantMalformed[T any](t testing.TB, sentinel error, name string, decode func(string, []byte) (T, error), record, path string, cases []Malformed) {
	t.Helper()
	for _, tc := range cases {
		data, errHas := tc[0], tc[1]
		_, err := decode(path, []byte(data))
		if err == nil || !strings.Contains(err.Error(), errHas) {
			t.Errorf("%s(%s) = %v, want error containing %q", name, data, err, errHas)
			continue
		}
		if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), record+" at "+path) {
			t.Errorf("error %q should wrap %v and name the record and path", err, sentinel)
		}
	}
}
