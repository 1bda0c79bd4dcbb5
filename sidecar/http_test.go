package sidecar

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func fileRouter(t testing.TB, m *bucketmap.Map) *router.Router {
	t.Helper()
	r, err := router.NewFromFile(clustertest.WriteMapFile(t, t.TempDir(), m), router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func TestListen(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0", "unix:" + filepath.Join(t.TempDir(), "r.sock")} {
		ln, err := Listen(ok, false)
		if err != nil {
			if strings.Contains(ok, "::1") {
				continue // no IPv6 loopback here
			}
			t.Fatalf("%s: %v", ok, err)
		}
		ln.Close()
	}
	for _, bad := range []string{"0.0.0.0:0", ":0", "10.1.2.3:80", "nohostport", "unix:"} {
		if ln, err := Listen(bad, false); err == nil {
			ln.Close()
			t.Errorf("%s accepted", bad)
		}
	}
	if ln, err := Listen("0.0.0.0:0", true); err != nil {
		t.Fatalf("--allow-public: %v", err)
	} else {
		ln.Close()
	}
	// A live socket is not stolen.
	sock := "unix:" + filepath.Join(t.TempDir(), "live.sock")
	ln, err := Listen(sock, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := Listen(sock, false); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
}

func get(t *testing.T, h http.Handler, target string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest("GET", target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	res := w.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func post(t *testing.T, h http.Handler, target, body string) (*http.Response, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("POST", target, strings.NewReader(body)))
	res := w.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

type routeJSON struct {
	UID        string `json:"uid"`
	Bucket     uint32 `json:"bucket"`
	Level      int    `json:"level"`
	Node       string `json:"node"`
	DSN        string `json:"dsn"`
	MapVersion uint64 `json:"map_version"`
	State      string `json:"state"`
	Target     string `json:"target"`
	DataLost   bool   `json:"data_lost"`
	Suspended  bool   `json:"suspended"`
	Stale      bool   `json:"stale"`
	Moved      bool   `json:"moved"`
	MovedFrom  string `json:"moved_from"`
}

func TestHTTPAPI(t *testing.T) {
	m1, _ := bucketmap.New(4, clustertest.Nodes(3), t0)
	m2 := clustertest.Next(m1)
	if err := m2.Assign(bucketmap.Bucket{Prefix: 0, Depth: m2.Level}, "pg3", bucketmap.AssignOptions{}); err != nil {
		t.Fatal(err)
	}
	r := fileRouter(t, m2)
	h := Handler(r, HandlerOptions{MaxBatch: 5})

	res, body := get(t, h, "/v1/route?uid="+url.QueryEscape("älice"))
	var one routeJSON
	if res.StatusCode != 200 || json.Unmarshal([]byte(body), &one) != nil {
		t.Fatalf("GET route: %d %s", res.StatusCode, body)
	}
	want, _ := r.Route("älice")
	if one.UID != "älice" || one.Node != string(want.Node) || one.Bucket != want.Bucket || one.MapVersion != 2 || one.State != "active" {
		t.Fatalf("GET route: %+v, want %+v", one, want)
	}

	// Batch: one answer per uid, in order, all from one map version.
	res, body = post(t, h, "/v1/route", `{"uids":["a","b","c"]}`)
	var batch struct {
		MapVersion uint64      `json:"map_version"`
		Routes     []routeJSON `json:"routes"`
	}
	if res.StatusCode != 200 || json.Unmarshal([]byte(body), &batch) != nil || len(batch.Routes) != 3 || batch.Routes[1].UID != "b" || batch.MapVersion != 2 {
		t.Fatalf("POST route: %d %s", res.StatusCode, body)
	}

	// Stale-map protocol over HTTP.
	var movedUID string
	for i := 0; movedUID == ""; i++ {
		if rt, _ := r.Route(fmt.Sprint("m", i)); rt.Bucket == 0 {
			movedUID = fmt.Sprint("m", i)
		}
	}
	_, body = get(t, h, "/v1/route?map_version=1&uid="+movedUID)
	json.Unmarshal([]byte(body), &one)
	if !one.Moved || one.MovedFrom != "pg1" || one.Node != "pg3" {
		t.Fatalf("moved answer %s", body)
	}
	_, body = post(t, h, "/v1/route", `{"uids":["`+movedUID+`"],"map_version":1}`)
	json.Unmarshal([]byte(body), &batch)
	if !batch.Routes[0].Moved {
		t.Fatalf("batch moved answer %s", body)
	}

	// Bad input: 400 with a JSON error naming the problem.
	long := strings.Repeat("x", MaxUIDLen+1)
	for _, tc := range []struct {
		method, target, body, errHas string
	}{
		{"GET", "/v1/route", "", "uid is missing"},
		{"GET", "/v1/route?uid=", "", "uid is missing"},
		{"GET", "/v1/route?uid=" + long, "", "1025 bytes"},
		{"GET", "/v1/route?uid=%ff%fe", "", "not valid UTF-8"},
		{"GET", "/v1/route?uid=a&uid=b", "", "one uid per GET"},
		{"GET", "/v1/route?uid=a&map_version=-1", "", "map_version"},
		{"POST", "/v1/route", `{"uids":["a"`, "bad JSON"},
		{"POST", "/v1/route", `{"uid":"a"}`, `unknown field "uid"`},
		{"POST", "/v1/route", `{"uids":[]}`, `"uids" is missing`},
		{"POST", "/v1/route", `{"uids":["a","b","c","d","e","f"]}`, "6 uids in one batch; the limit is 5"},
		{"POST", "/v1/route", `{"uids":["a",""]}`, "uids[1]: uid is missing"},
		{"POST", "/v1/route", `{"uids":["a"]} {}`, "trailing data"},
		{"POST", "/v1/route", `{"uids":[1]}`, "bad JSON"},
		// encoding/json would route these as U+FFFD: a raw invalid byte,
		// a lone surrogate escape, a high one followed by no low one.
		{"POST", "/v1/route", "{\"uids\":[\"a\",\"b\xffc\"]}", "uids[1]: uid is not valid UTF-8"},
		{"POST", "/v1/route", `{"uids":["\ud800"]}`, "uids[0]: uid is not valid UTF-8"},
		{"POST", "/v1/route", `{"uids":["a","\udc00x"]}`, "uids[1]: uid is not valid UTF-8"},
		{"POST", "/v1/route", `{"uids":["\ud800\u0041"]}`, "uids[0]: uid is not valid UTF-8"},
	} {
		var res *http.Response
		var body string
		if tc.method == "GET" {
			res, body = get(t, h, tc.target)
		} else {
			res, body = post(t, h, tc.target, tc.body)
		}
		var e struct{ Error string }
		if res.StatusCode != 400 || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, tc.errHas) {
			t.Errorf("%s %s %s: %d %s, want 400 mentioning %q", tc.method, tc.target, tc.body, res.StatusCode, body, tc.errHas)
		}
	}
	// What is valid stays valid: a surrogate pair, an escaped backslash
	// before "ud800" (the text \ud800), and U+FFFD itself.
	for _, body := range []string{`{"uids":["\ud83d\ude00"]}`, `{"uids":["\\ud800"]}`, `{"uids":["\ufffd","ï¿½"]}`} {
		if res, out := post(t, h, "/v1/route", body); res.StatusCode != 200 {
			t.Errorf("POST %s: %d %s, want 200", body, res.StatusCode, out)
		}
	}
	if res, _ := post(t, h, "/v1/map", ""); res.StatusCode != 405 {
		t.Errorf("POST /v1/map: %d", res.StatusCode)
	}
	if res, _ := get(t, h, "/nope"); res.StatusCode != 404 {
		t.Errorf("GET /nope: %d", res.StatusCode)
	}

	// GET /v1/map is a map file; If-None-Match makes polling cheap.
	res, body = get(t, h, "/v1/map")
	etag := res.Header.Get("ETag")
	if res.StatusCode != 200 || etag == "" {
		t.Fatalf("map: %d %q", res.StatusCode, etag)
	}
	rec, err := bucketmap.DecodeMapFile("", []byte(body))
	if err != nil || rec.Seed != clustertest.Seed {
		t.Fatalf("map body: %v", err)
	}
	if back, err := bucketmap.Decode("", rec.Map); err != nil || back.Version != 2 {
		t.Fatalf("embedded map: %v", err)
	}
	if res, body := get(t, h, "/v1/map", "If-None-Match", etag); res.StatusCode != 304 || body != "" {
		t.Fatalf("conditional GET: %d %q", res.StatusCode, body)
	}
	if res, _ := get(t, h, "/v1/map", "If-None-Match", `"c1-v1"`); res.StatusCode != 200 {
		t.Fatalf("conditional GET with an old tag: %d", res.StatusCode)
	}

	for path, want := range map[string]string{"/healthz": "ok", "/readyz": `"ready":true`, "/metrics": "shardvisor_router_lookups_total", "/": "<title>shardvisor router</title>", "/v1/status": `"cells":`} {
		if res, body := get(t, h, path); res.StatusCode != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, body lacks %q", path, res.StatusCode, want)
		}
	}
	_, metrics := get(t, h, "/metrics")
	if !strings.Contains(metrics, `shardvisor_router_bad_requests_total{reason="uid_too_long"} 1`) || !strings.Contains(metrics, "shardvisor_router_map_version 2") {
		t.Errorf("metrics missing counters:\n%s", metrics)
	}
}

func TestHTTPNotReady(t *testing.T) {
	// A router of a cluster that does not exist never gets a map.
	z := testenv.StartZK(t)
	r := router.New(session(t, z.ConnectString, 0), topo.MustPaths(z.Root, "none"), router.Options{})
	t.Cleanup(r.Close)
	h := Handler(r, HandlerOptions{})
	for _, p := range []string{"/readyz", "/v1/route?uid=a", "/v1/map", "/v1/status"} {
		if res, body := get(t, h, p); res.StatusCode != 503 || !strings.Contains(body, "no bucket map yet") {
			t.Errorf("GET %s before the first map: %d %s", p, res.StatusCode, body)
		}
	}
	if res, _ := post(t, h, "/v1/route", `{"uids":["a"]}`); res.StatusCode != 503 {
		t.Errorf("POST before the first map: %d", res.StatusCode)
	}
	if res, _ := get(t, h, "/healthz"); res.StatusCode != 200 {
		t.Error("healthz should answer before the map")
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", "quote\" back\\slash", "ctl\x00\x01\x1f\n\r\t", "ünïcødé ✓ 𝄞", "\u2028"} {
		b := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Errorf("%q -> %s -> %q (%v)", s, b, back, err)
		}
	}
}

func FuzzHTTPRoute(f *testing.F) {
	m, _ := bucketmap.New(4, clustertest.Nodes(3), t0)
	r := fileRouter(f, m)
	h := Handler(r, HandlerOptions{MaxBatch: 50})
	f.Add("uid=alice", `{"uids":["a","b"],"map_version":1}`)
	f.Add("uid=%ff&map_version=x", `{"uids":[`)
	f.Add("", `{"uids":["\u0000"]}`)
	f.Add("", `{"uids":["\ud800","\ud83d\ude00"]}`)
	f.Add("", "{\"uids\":[\"\xff\"]}")
	f.Fuzz(func(t *testing.T, query, body string) {
		for _, req := range []*http.Request{
			httptest.NewRequest("GET", "/v1/route?"+url.PathEscape(query), nil),
			httptest.NewRequest("POST", "/v1/route", strings.NewReader(body)),
		} {
			if q, err := url.ParseQuery(query); err == nil && req.Method == "GET" {
				req.URL.RawQuery = q.Encode()
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			switch w.Code {
			case 200, 400:
			default:
				t.Fatalf("%s: status %d", req.Method, w.Code)
			}
			if !json.Valid(w.Body.Bytes()) {
				t.Fatalf("%s: invalid JSON %q", req.Method, w.Body.String())
			}
			// A routed batch never had a uid the decoder had to repair:
			// every U+FFFD answered was in the request.
			if req.Method == "POST" && w.Code == 200 &&
				strings.Count(w.Body.String(), "\ufffd") > strings.Count(body, "\ufffd")+strings.Count(strings.ToLower(body), `\ufffd`) {
				t.Fatalf("POST %q: routed a repaired uid: %s", body, w.Body.String())
			}
		}
	})
}

// The read-only endpoints answer GET and HEAD; every other method gets 405
// with Allow (POST and DELETE used to get 200). /v1/route also takes POST.
func TestHTTPMethods(t *testing.T) {
	m, _ := bucketmap.New(4, clustertest.Nodes(3), t0)
	h := Handler(fileRouter(t, m), HandlerOptions{})
	for _, path := range []string{"/", "/v1/map", "/v1/status", "/v1/fleet", "/v1/groups", "/healthz", "/readyz", "/metrics", "/v1/route?uid=a"} {
		allow := "GET, HEAD"
		if strings.HasPrefix(path, "/v1/route") {
			allow = "GET, HEAD, POST"
		}
		for _, method := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"} {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(`{"uids":["a"]}`)))
			allowed := strings.Contains(allow, method)
			if got := w.Code == http.StatusMethodNotAllowed; got == allowed || (!allowed && w.Header().Get("Allow") != allow) {
				t.Errorf("%s %s: HTTP %d, Allow %q", method, path, w.Code, w.Header().Get("Allow"))
			}
		}
	}
	// An unknown path stays 404 whatever the method.
	if res, _ := post(t, h, "/nope", ""); res.StatusCode != 404 {
		t.Errorf("POST /nope: %d", res.StatusCode)
	}
}
