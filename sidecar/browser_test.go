package sidecar

import (
	"context"
	"fmt"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/testenv"
)

func chromium(t *testing.T) string {
	if p := chromiumOrSkip(t); p != "" {
		return p
	}
	t.Skip("chromium not installed (apt-get install chromium)")
	return ""
}

// chromiumOrSkip finds chromium, or returns "" (under CI it fails the
// test instead), for a test that uses it for one part.
func chromiumOrSkip(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is required under CI (scripts/install-deps installs it)")
	}
	t.Log("chromium not installed (apt-get install chromium): the browser part is skipped")
	return ""
}

// newServer serves h until the test ends and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// headless runs chromium on url with extra flags and returns its stdout.
func headless(t *testing.T, bin, url string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1280,900", "--virtual-time-budget=4000"}, extra...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	cmd.WaitDelay = 5 * time.Second
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", extra, err, errb.String())
	}
	return out.String()
}

// The status page renders a grid of buckets coloured by owner in a real
// browser: every node's colour is on screen, in proportion to its buckets.
func TestStatusPageRendersInBrowser(t *testing.T) {
	bin := chromium(t)
	m, _ := bucketmap.New(6, clustertest.Nodes(4), t0) // 64 buckets, 16 each
	m = clustertest.Next(m)
	if err := m.SetMoving(bucketmap.Bucket{Prefix: 0, Depth: m.Level}, "pg4", "mv-0"); err != nil {
		t.Fatal(err)
	}
	r := fileRouter(t, m)
	srv := httptest.NewServer(Handler(r, HandlerOptions{}))
	defer srv.Close()

	dom := headless(t, bin, srv.URL+"/", "--dump-dom")
	if n := strings.Count(dom, `class="cell`); n != 64 {
		t.Fatalf("%d grid cells in the rendered page, want 64", n)
	}
	if !strings.Contains(dom, `class="cell moving"`) || !strings.Contains(dom, "bucket 0: pg1 → pg4") {
		t.Fatal("the moving bucket is not highlighted")
	}
	for _, want := range []string{">c1<", ">2<", "pg1", "pg4", "balanced"} {
		if !strings.Contains(dom, want) {
			t.Fatalf("rendered page lacks %q", want)
		}
	}

	shot := filepath.Join(t.TempDir(), "status.png")
	headless(t, bin, srv.URL+"/", "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// The page's palette for owners 0..3.
	palette := []string{"4e79a7", "f28e2b", "e15759", "76b7b2"}
	counts := make([]int, len(palette))
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			hex := fmt.Sprintf("%02x%02x%02x", r>>8, g>>8, b>>8)
			for i, p := range palette {
				if hex == p {
					counts[i]++
				}
			}
		}
	}
	t.Logf("owner colour pixels: %v", counts)
	for i, c := range counts {
		if c < 1000 {
			t.Fatalf("owner %d's colour covers %d pixels; the grid did not render (%v)", i, c, counts)
		}
	}
	// 16 buckets each: no colour should dominate another by more than 2x.
	for i := range counts {
		for j := range counts {
			if counts[i] > 2*counts[j] {
				t.Fatalf("colour areas out of proportion to bucket counts: %v", counts)
			}
		}
	}
	if os.Getenv("SHARDVISOR_KEEP_SCREENSHOT") != "" {
		data, _ := os.ReadFile(shot)
		os.WriteFile(os.Getenv("SHARDVISOR_KEEP_SCREENSHOT"), data, 0o644)
	}
}

// element returns the serialized element of dom that starts with open
// (e.g. `<tr data-member="router/r-old"`) up to its closing tag.
func element(t *testing.T, dom, open, closing string) string {
	t.Helper()
	i := strings.Index(dom, open)
	if i < 0 {
		t.Fatalf("the rendered page has no %s", open)
	}
	j := strings.Index(dom[i:], closing)
	if j < 0 {
		t.Fatalf("%s is not closed", open)
	}
	return dom[i : i+j]
}

func mustContain(t *testing.T, what, s string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(s, w) {
			t.Fatalf("%s lacks %q:\n%s", what, w, s)
		}
	}
}

// The status page shows the fleet: every member with its map version,
// the stragglers highlighted with how long they have been behind, each
// pool's generation and last swap, the moves in flight and the recent
// ones with their pauses and stragglers, and the members' ZooKeeper view
// with a fail-static episode.
func TestFleetPageInBrowser(t *testing.T) {
	bin := chromium(t)
	z := testenv.StartZK(t)
	sc := newFleetScene(t, z, plain)
	dom := headless(t, bin, newServer(t, sc.handler(0))+"/", "--dump-dom")

	if n := strings.Count(dom, `class="cell`); n != 16 {
		t.Fatalf("%d grid cells, want 16: the grid is gone", n)
	}
	mustContain(t, "the page", dom, "5 members (2 routers, 3 supervisors in 2 pools) · 3 behind map version 3",
		`<div id="fleet-banner" class="banner" hidden="">`, // connected: no banner
		"this router's session: ")
	if strings.Contains(dom, "hunter2") {
		t.Fatal("the page shows the pool config's env")
	}

	self := element(t, dom, `<tr data-member="router/r-self">`, "</tr>")
	mustContain(t, "this router's row", self, "this router", "current", "127.0.0.1:8484")
	old := element(t, dom, `<tr data-member="router/r-old" class="straggler">`, "</tr>")
	mustContain(t, "r-old's row", old, "web7", "4242", "2 versions for ", "straggler")

	a := element(t, dom, `<tr data-member="pool/web/sup-a">`, "</tr>")
	mustContain(t, "sup-a's row", a, "web1", "serving", "<td class=\"num\">4</td>", "reload", "2/2", "current", "connected")
	b := element(t, dom, `<tr data-member="pool/web/sup-b" class="straggler">`, "</tr>")
	mustContain(t, "sup-b's row", b, "web2", "degraded", "1/2 (1 behind)", "2 versions for ", "straggler", "suspended",
		"worker 3 did not acknowledge map version")
	x := element(t, dom, `<tr data-member="pool/api/sup-x" class="straggler">`, "</tr>")
	mustContain(t, "sup-x's row", x, "record unreadable", "bogus")

	web := element(t, dom, `<div class="pool" data-pool="web">`, "</table>")
	mustContain(t, "pool web", web, "config version <b>0</b>", "map delivery <b>reload</b>", "2 supervisors, ", "1 behind")
	swap := element(t, dom, `<div class="poolswap" data-pool-swap="web">`, "</div>")
	mustContain(t, "pool web's last swap", swap, `<b class="bad">failed</b>`, "generation 4", "by sup-a", "took 61.50 s",
		"error: 2 new workers not ready within 60s")
	if !regexp.MustCompile(`by sup-a · [0-9]+m[0-9]{2}s ago`).MatchString(swap) {
		t.Fatalf("pool web's last swap does not say when: %s", swap)
	}
	api := element(t, dom, `<div class="poolswap" data-pool-swap="api">`, "</div>")
	mustContain(t, "pool api's last swap", api, "none published yet")

	copying := element(t, dom, `<tr data-move="`+sc.copying+`">`, "</tr>")
	mustContain(t, "the copying move", copying, "copy", " for ", "pg1 → pg3")
	window := element(t, dom, `<tr data-move="`+sc.window+`">`, "</tr>")
	mustContain(t, "the move in its rollback window", window, "reversible", "verify ok", "reverse stream running, 4.0 KiB behind (probed ", "left: shardctl move rollback "+sc.window)
	failed := element(t, dom, `<tr data-move="`+sc.failed+`">`, "</tr>")
	mustContain(t, "the failed move", failed, "failed", "pg2 → pg1", "42.5 ms", "1.50 s", "verify: table notes differs")
	straggly := element(t, dom, `<tr data-move="`+sc.straggly+`" class="straggler">`, "</tr>")
	mustContain(t, "the move with stragglers", straggly, "done", "30.0 ms", "2.00 s",
		sc.p.PoolMember("web", "sup-b")+" (map version 1)", sc.p.PoolMember("api", "sup-x"), "pool member record does not decode")
	recent := element(t, dom, `<table id="moves-recent">`, "</table>")
	if n := strings.Count(recent, "<tr data-move="); n != 20 {
		t.Fatalf("%d recent moves shown, want 20", n)
	}
	mustContain(t, "recent moves", dom, "(newest 20 of 23)")

	partial := element(t, dom, `<tr data-schema-change="002-note" class="failstatic">`, "</tr>")
	mustContain(t, "the partial schema change", partial, "partial", "pg1, pg3", "pg2 (unreachable: connection refused)", "by ops@admin")
	mustContain(t, "the applied schema change", element(t, dom, `<tr data-schema-change="001-init">`, "</tr>"), "applied", "pg1, pg2, pg3")
	mustContain(t, "the schema summary", dom, "(2 recorded, 1 not applied everywhere)",
		"2 differences (1 blocking moves) over 3 nodes: pg1 vs pg2: column body differs")

	zk := element(t, dom, `<tr data-zk-member="web/sup-b" class="failstatic">`, "</tr>")
	mustContain(t, "sup-b's ZooKeeper row", zk, "suspended", "since "+sc.fs.Since.UTC().Format(time.RFC3339Nano),
		"until "+sc.fs.Until.UTC().Format(time.RFC3339Nano)+" (3m00s)", "2 peers agreed")
	mustContain(t, "sup-a's ZooKeeper row", element(t, dom, `<tr data-zk-member="web/sup-a">`, "</tr>"), "connected")
}

// Records are input from anyone who can write to ZooKeeper: markup in
// them is shown as text on the status page and never runs.
func TestFleetPageEscapesRecords(t *testing.T) {
	bin := chromium(t)
	z := testenv.StartZK(t)
	// Each payload, if it ran, would mark the document (and its title).
	attacks := map[string]string{
		"host":             `<img src=x onerror="document.title='PWNED';document.documentElement.dataset.pwned='host'">`,
		"last_error":       `<script>document.title='PWNED';document.documentElement.dataset.pwned='last_error'</script>`,
		"swap error":       `<svg onload="document.documentElement.dataset.pwned='swap'"></svg>`,
		"move error":       `<img src=x onerror="document.documentElement.dataset.pwned='move'">`,
		"straggler member": `"><img src=x onerror="document.documentElement.dataset.pwned='straggler'">`,
		"straggler error":  `<input autofocus onfocus="document.documentElement.dataset.pwned='focus'">`,
		"router addr":      `<iframe srcdoc="<script>parent.document.documentElement.dataset.pwned='iframe'</script>"></iframe>`,
		"router host":      `<details open ontoggle="document.documentElement.dataset.pwned='toggle'">web7</details>`,
		"schema error":     `<img src=x onerror="document.documentElement.dataset.pwned='schema'">`,
		"schema by":        `<svg onload="document.documentElement.dataset.pwned='schema-by'"></svg>`,
		"drift sample":     `<script>document.documentElement.dataset.pwned='drift'</script>`,
	}
	used := map[string]bool{}
	sc := newFleetScene(t, z, func(name, def string) string {
		if a, ok := attacks[name]; ok {
			used[name] = true
			return a
		}
		return def
	})
	if len(used) != len(attacks) {
		t.Fatalf("payloads placed in %v of %d fields", used, len(attacks))
	}
	dom := headless(t, bin, newServer(t, sc.handler(0))+"/", "--dump-dom")
	if strings.Contains(dom, "data-pwned") || !strings.Contains(dom, "<title>shardvisor router</title>") {
		t.Fatalf("a payload ran:\n%s", dom)
	}
	for _, tag := range []string{"<img", "<svg", "<input", "<iframe", "<details", "<script>document"} {
		if strings.Contains(dom, tag) {
			t.Fatalf("a record's markup became an element (%s):\n%s", tag, dom)
		}
	}
	// Shown as text: escaped in the serialized DOM.
	esc := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")
	for name, a := range attacks {
		if !strings.Contains(dom, esc.Replace(a)) {
			t.Fatalf("the %s payload is not shown as text (%q):\n%s", name, esc.Replace(a), dom)
		}
	}
	// The page still works around them.
	mustContain(t, "the page", dom, `<tr data-member="pool/web/sup-b" class="straggler">`, "generation 4")
}
