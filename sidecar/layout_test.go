package sidecar

import (
	"bytes"
	"encoding/json"
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/topo"
)

// layoutProbe runs in the page after it has drawn both views and writes
// what it measured into the DOM, for --dump-dom: whether the page is wider
// than the window, each table's right edge against its section's, and the
// Patroni group cell's lines and how many of them wrapped.
const layoutProbe = `<script>
setTimeout(() => {
  const out = {page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth, tables: {}};
  for (const t of document.querySelectorAll("table[id]")) {
    const box = t.closest(".scroll"), sec = t.closest("section");
    const edge = box ? box.getBoundingClientRect().right : t.getBoundingClientRect().right;
    out.tables[t.id] = {outside: Math.round(edge - sec.getBoundingClientRect().right + parseFloat(getComputedStyle(sec).paddingRight)),
      scrolls: !!box && getComputedStyle(box).overflowX === "auto"};
  }
  const g = document.querySelector("#nodes tbody td:last-child:not(:empty)");
  if (g) {
    out.group = {text: g.innerText, wrapped: 0, width: Math.round(g.getBoundingClientRect().width)};
    for (const d of g.children) {
      if (d.offsetHeight > 1.5 * parseFloat(getComputedStyle(d).lineHeight)) out.group.wrapped++;
    }
  }
  const pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.textContent = JSON.stringify(out);
  document.body.append(pre);
}, 1500);
</script>`

type layoutReport struct {
	Page, Window int
	Tables       map[string]struct {
		Outside int
		Scrolls bool
	}
	Group *struct {
		Text    string
		Wrapped int
		Width   int
	}
}

// At 1400 px the status page shows a Patroni group's primary once, then
// its other members with their roles, each on a line of its own, and no
// table reaches past its section (the moves in flight, with a long way
// back and a long error, included): a wide one scrolls inside its own box.
func TestStatusPageLayoutInBrowser(t *testing.T) {
	bin := chromium(t)
	m, _ := bucketmap.New(8, clustertest.Nodes(4), t0)
	m = clustertest.Next(m)
	if err := m.SetMoving(bucketmap.Bucket{Prefix: 3, Depth: m.Level}, "pg4", "mv-3"); err != nil {
		t.Fatal(err)
	}
	st, err := Status(fileRouter(t, m))
	if err != nil {
		t.Fatal(err)
	}
	st.Groups = map[bucketmap.NodeID]*GroupView{"pg2": {PatroniGroup: &topo.PatroniGroup{Scope: "pg2", Leader: "pg2-m1", Members: []topo.PatroniMember{
		{Name: "pg2-m1", Role: "primary", State: "running", Leader: true},
		{Name: "pg2-m2", Role: "replica", State: "streaming", Sync: true},
		{Name: "pg2-m3", Role: "replica", State: "streaming", LagBytes: 12345},
	}}, Problems: []topo.PatroniProblem{}}}

	now := time.Now().UTC()
	mv := func(i int, state string) fleet.Move {
		id := "mv-20261129-1158" + string(rune('0'+i)) + "-b10" + string(rune('0'+i))
		return fleet.Move{ID: id, Bucket: uint32(100 + i), Level: 8, Source: "pg1", Target: "pg4", State: state, StateSince: now.Add(-30 * time.Second),
			UpdatedAt: now.Add(-time.Minute), PauseMS: 42.5, MemberWaitMS: 1500, Stragglers: []fleet.Straggler{}}
	}
	window := mv(1, "reversible")
	window.Verify, window.Reverse = "ok", &fleet.MoveReverse{State: "running", WindowUntil: now.Add(14 * time.Minute)}
	failing := mv(2, "copy")
	failing.Error = "could not connect to server: connection refused; the mover retries in 5 s; last attempt at " + now.Format(time.RFC3339Nano)
	straggly := mv(3, "pause")
	straggly.Stragglers = []fleet.Straggler{{Member: "pools/web/members/sup-b", MapVersion: 41}}
	fv := fleet.View{Available: true, Cluster: "c1", Now: now, TakenAt: now, Router: fleet.Self{Source: "zookeeper", ZKState: "connected", MapVersion: m.Version},
		Members: []fleet.Member{{Kind: "router", Name: "r-self", Self: true, Host: "web1", PID: 1234, Addr: "127.0.0.1:8484", MapVersion: m.Version, UpdatedAt: now}},
		Pools:   []fleet.Pool{},
		Moves:   fleet.Moves{InFlight: []fleet.Move{window, failing, straggly}, Recent: []fleet.Move{mv(4, "done")}, Finished: 1},
		Schema:  fleet.Schema{ByState: map[string]int{}, Recent: []fleet.SchemaChange{}, NotApplied: []fleet.SchemaChange{}}}

	mux := http.NewServeMux()
	mux.HandleFunc("/v1/status", func(w http.ResponseWriter, _ *http.Request) { json.NewEncoder(w).Encode(st) })
	mux.HandleFunc("/v1/fleet", func(w http.ResponseWriter, _ *http.Request) { json.NewEncoder(w).Encode(fv) })
	// The page as served, with the probe after its own script (no CSP
	// here: the probe is inline too).
	page := bytes.Replace(statusPage, []byte("</body>"), []byte(layoutProbe+"</body>"), 1)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(page)
	})
	dom := headless(t, bin, newServer(t, mux)+"/", "--dump-dom", "--window-size=1400,900")

	probe := regexp.MustCompile(`<pre id="layout-probe">(.*?)</pre>`).FindStringSubmatch(dom)
	if probe == nil {
		t.Fatalf("the layout probe did not run:\n%s", dom)
	}
	var rep layoutReport
	if err := json.Unmarshal([]byte(html.UnescapeString(probe[1])), &rep); err != nil {
		t.Fatalf("layout probe %s: %v", probe[1], err)
	}
	t.Logf("layout at 1400 px: %s", probe[1])

	if rep.Group == nil {
		t.Fatal("no Patroni group cell on the page")
	}
	if n := strings.Count(rep.Group.Text, "pg2-m1"); n != 1 {
		t.Fatalf("the group cell names the primary %d times, want once: %q", n, rep.Group.Text)
	}
	for _, want := range []string{"primary pg2-m1", "pg2-m2 replica · sync", "pg2-m3 replica · lag 12345 B"} {
		if !strings.Contains(rep.Group.Text, want) {
			t.Fatalf("the group cell lacks %q: %q", want, rep.Group.Text)
		}
	}
	if rep.Group.Wrapped != 0 {
		t.Fatalf("%d of the group cell's lines wrap (cell %d px wide): %q", rep.Group.Wrapped, rep.Group.Width, rep.Group.Text)
	}
	if rep.Page > rep.Window {
		t.Fatalf("the page is %d px wide in a %d px window", rep.Page, rep.Window)
	}
	for _, id := range []string{"nodes", "moves-inflight", "moves-recent", "fleet-routers"} {
		tb, ok := rep.Tables[id]
		if !ok {
			t.Fatalf("no table %s on the page", id)
		}
		if tb.Outside > 0 || !tb.Scrolls {
			t.Fatalf("table %s: reaches %d px past its section, scrolls in its own box: %v", id, tb.Outside, tb.Scrolls)
		}
	}
}
