package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/router"
)

// wireRoute is a routing answer as docs/router-api.md documents it: its
// fields, in order, and the optional ones omitted when empty.
type wireRoute struct {
	UID        string `json:"uid"`
	Bucket     uint32 `json:"bucket"`
	Level      int    `json:"level"`
	Node       string `json:"node"`
	DSN        string `json:"dsn"`
	PoolDSN    string `json:"pool_dsn,omitempty"`
	Group      string `json:"group,omitempty"`
	MapVersion uint64 `json:"map_version"`
	State      string `json:"state"`
	Target     string `json:"target,omitempty"`
	DataLost   bool   `json:"data_lost"`
	Suspended  bool   `json:"suspended"`
	Stale      bool   `json:"stale"`
	Moved      bool   `json:"moved"`
	MovedFrom  string `json:"moved_from,omitempty"`
}

func wireOf(uid string, rt router.Route) wireRoute {
	w := wireRoute{UID: uid, Bucket: rt.Bucket, Level: rt.Level, Node: string(rt.Node), DSN: rt.DSN, PoolDSN: rt.PoolDSN, Group: rt.Group,
		MapVersion: rt.MapVersion, State: string(rt.State), Target: string(rt.Target), DataLost: rt.DataLost,
		Suspended: rt.Suspended, Stale: rt.Stale, Moved: rt.Moved}
	if rt.Moved {
		w.MovedFrom = string(rt.MovedFrom)
	}
	return w
}

// encodeJSON is encoding/json's text of v, without HTML escapes (the
// answers have none: a DSN's '&' is written as is) and the final newline.
func encodeJSON(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// The hand-written routing answers are byte for byte what encoding/json
// writes for the documented fields. (For a \b, \f, U+2028 or U+2029 in a
// string the two escape differently; both are JSON for the same string:
// TestAppendJSONString.)
func TestRouteWireFormatIsEncodingJSONs(t *testing.T) {
	routes := []struct {
		uid string
		rt  router.Route
	}{
		{"alice", router.Route{Bucket: 4, Level: 4, Node: "pg1", DSN: "postgres://app@127.0.0.1:25432/app", PoolDSN: "postgres://app@127.0.0.1:27432/app", MapVersion: 5, State: bucketmap.BucketActive}},
		{"ünïcødé ✓ 𝄞 \"q\" \\ <&> \x00\x1f\n\r\t", router.Route{Bucket: 1 << 31, Level: 32, Node: "pg2",
			DSN: "postgres://app@h1:5432,h2:5432/app?target_session_attrs=read-write&connect_timeout=5", Group: "pg-a",
			MapVersion: 1<<64 - 1, State: bucketmap.BucketMoving, Target: "pg3", DataLost: true, Suspended: true}},
		{"bob", router.Route{Node: "pg4", MapVersion: 7, State: bucketmap.BucketActive, Stale: true, Moved: true, MovedFrom: "pg1"}},
		{"carol", router.Route{Node: "pg4", State: bucketmap.BucketActive, MovedFrom: "pg1"}}, // not moved: no moved_from
	}
	var uids []string
	var rts []router.Route
	var wires []wireRoute
	for _, r := range routes {
		want := encodeJSON(t, wireOf(r.uid, r.rt))
		if got := JSONRoute(r.uid, r.rt); !bytes.Equal(got, want) {
			t.Errorf("route of %q:\n got: %s\nwant: %s", r.uid, got, want)
		}
		uids, rts, wires = append(uids, r.uid), append(rts, r.rt), append(wires, wireOf(r.uid, r.rt))
	}
	batch := struct {
		MapVersion uint64      `json:"map_version"`
		Routes     []wireRoute `json:"routes"`
	}{7, wires}
	if got, want := appendBatch(nil, 7, uids, rts), encodeJSON(t, batch); !bytes.Equal(got, want) {
		t.Errorf("batch:\n got: %s\nwant: %s", got, want)
	}
}

// GET /readyz and the errors answer exactly what the hand-written writers
// before the typed structs did.
func TestReadyAndErrorAnswersKeepTheirBytes(t *testing.T) {
	m, _ := bucketmap.New(4, clustertest.Nodes(3), t0)
	r := fileRouter(t, m)
	h := Handler(r, HandlerOptions{})
	res, body := get(t, h, "/readyz")
	want := fmt.Sprintf("{\"ready\":true,\"map_version\":%d,\"zk_state\":%q,\"source\":%q}\n", m.Version, r.ZKState(), r.Source())
	if res.StatusCode != 200 || body != want {
		t.Errorf("GET /readyz: %d %q, want %q", res.StatusCode, body, want)
	}
	for _, msg := range []string{"plain", `uid is "<&>" é`, "ctl\x00\n"} {
		w := httptest.NewRecorder()
		writeError(w, http.StatusBadRequest, msg)
		old, _ := json.Marshal(map[string]string{"error": msg})
		if got := w.Body.String(); got != string(old)+"\n" {
			t.Errorf("error %q: %q, want %q", msg, got, old)
		}
	}
}
