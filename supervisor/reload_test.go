package supervisor

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
)

// Reload mode with real workers and the real ensemble: a map change
// reaches the running workers in place (no process starts), each
// acknowledges it, the member record in ZooKeeper publishes the lowest
// version they route by, and a worker that never acknowledges is replaced
// by one that starts on the new map.

// mapCluster writes a cluster record and map version 1; put(v) writes
// version v of the same map, with bucket 0 split from version 3 on (a
// single-bucket split: mixed depths, format version 2), so that workers
// reload a map of mixed depths in place.
func mapCluster(t *testing.T, e *zkEnv) (crec topo.ClusterRecord, put func(v uint64) string) {
	t.Helper()
	crec = topo.ClusterRecord{Version: topo.ClusterVersion, Name: e.paths.ClusterName(), Seed: "5eed0000000000000000000000000001", CreatedAt: time.Now().UTC()}
	cdata, _ := topo.Encode(crec)
	e.put(t, e.paths.Cluster(), cdata)
	bm, err := bucketmap.New(2, []bucketmap.Node{{ID: "n1", DSN: "postgres://h/d", Weight: 1, State: bucketmap.NodeActive}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	put = func(v uint64) string {
		m := bm.Clone()
		m.Version = v
		if v >= 3 {
			if err := m.SplitBucket(bucketmap.Bucket{Prefix: 0, Depth: 2}); err != nil {
				t.Fatal(err)
			}
		}
		raw, err := bucketmap.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		e.put(t, e.paths.Map(), raw)
		return mustDoc(t, crec, raw)
	}
	put(1)
	return crec, put
}

// memberRecord reads this supervisor's member record from ZooKeeper.
func (e *zkEnv) memberRecord(t *testing.T) *topo.PoolMember {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ents, err := topo.ListPoolMembers(ctx, e.s, e.paths, "web")
	if err != nil || len(ents) != 1 || ents[0].Err != nil {
		return nil
	}
	return ents[0].Rec
}

func reloadCfg(sig string, ack time.Duration) func(*topo.PoolConfig) {
	return func(c *topo.PoolConfig) {
		c.MapDelivery = topo.MapDelivery{Mode: topo.MapDeliveryReload, Signal: sig, AckTimeout: topo.Duration(ack)}
		one := 1
		c.Surge = &one
	}
}

func TestReloadModeDeliversMapsWithoutRestarts(t *testing.T) {
	t.Parallel()
	e := startZK(t)
	_, put := mapCluster(t, e)
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := cfgFor(t, port, 2, nil)
	reloadCfg("", 3*time.Second)(c)
	e.setConfig(t, c)
	h := run(t, e.opts(t, e.z.ConnectString+e.z.Root, 4*time.Second))
	h.waitFor(20*time.Second, "generation 1", serving(1, 2))
	pids := h.pids()
	spawns := testCounter(t, h, "shardvisor_supervisor_worker_spawns_total", "")
	l := startLoad(addr, 2)

	// Three maps in a row, by file watch; then three more by signal
	// after a config change to SIGUSR2 (a swap: the config changed).
	var doc string
	for v := uint64(2); v <= 4; v++ {
		doc = put(v)
		h.waitFor(20*time.Second, fmt.Sprintf("both workers on map %d", v), onMap(v))
	}
	testenv.WaitFor(t, 20*time.Second, func() bool { m := e.memberRecord(t); return m != nil && m.MapVersion == 4 },
		"the member record to publish map version 4")
	m := h.sv.Status()
	if m.Generation != 1 || !slices.Equal(h.pids(), pids) {
		t.Fatalf("workers restarted for map changes: generation %d, pids %v -> %v", m.Generation, pids, h.pids())
	}
	if n := testCounter(t, h, "shardvisor_supervisor_worker_spawns_total", ""); n != spawns {
		t.Fatalf("%v worker spawns during map changes, want 0", n-spawns)
	}
	for _, w := range m.Workers {
		if w.MapVersion != 4 {
			t.Fatalf("worker %d routes by map %d, want 4: %+v", w.ID, w.MapVersion, m.Workers)
		}
	}
	for range 10 {
		r, err := get(addr)
		if err != nil || r.MapVersion != "4" || r.Map != doc {
			t.Fatalf("a worker answered with map %q (%v), want 4", r.MapVersion, err)
		}
	}
	if rec := e.memberRecord(t); rec.MapDelivery != topo.MapDeliveryReload {
		t.Fatalf("member record map_delivery %q", rec.MapDelivery)
	}
	if n := testCounter(t, h, "shardvisor_supervisor_map_acks_total", ""); n < 2 {
		t.Fatalf("map_acks_total %v", n)
	}

	reloadCfg("SIGUSR2", 3*time.Second)(c)
	e.setConfig(t, c)
	h.waitFor(20*time.Second, "generation 2 (config change)", serving(2, 2))
	pids = h.pids()
	for v := uint64(5); v <= 7; v++ {
		put(v)
		h.waitFor(20*time.Second, fmt.Sprintf("both workers on map %d (signal mode)", v), onMap(v))
	}
	testenv.WaitFor(t, 20*time.Second, func() bool { m := e.memberRecord(t); return m != nil && m.MapVersion == 7 },
		"the member record to publish map version 7 (signal mode)")
	if m := h.sv.Status(); m.Generation != 2 || !slices.Equal(h.pids(), pids) {
		t.Fatalf("signal mode restarted workers: generation %d, pids %v -> %v", m.Generation, pids, h.pids())
	}
	if n := testCounter(t, h, "shardvisor_supervisor_map_ack_timeouts_total", ""); n != 0 {
		t.Fatalf("%v ack timeouts with workers that reload", n)
	}
	l.finish(t)
}

func TestReloadModeReplacesWorkersThatDoNotAcknowledge(t *testing.T) {
	t.Parallel()
	e := startZK(t)
	_, put := mapCluster(t, e)
	port := testenv.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := cfgFor(t, port, 2, map[string]string{"TW_MAPMODE": "silent"})
	reloadCfg("", time.Second)(c)
	e.setConfig(t, c)
	h := run(t, e.opts(t, e.z.ConnectString+e.z.Root, 4*time.Second))
	h.waitFor(20*time.Second, "generation 1", serving(1, 2))
	old := h.pids()
	l := startLoad(addr, 2)
	doc := put(2)
	// The member record keeps saying 1 while a silent worker serves:
	// the mover must not count this host as having the new map.
	time.Sleep(500 * time.Millisecond) // deliberate: the record must stay at 1 for a while
	if rec := e.memberRecord(t); rec == nil || rec.MapVersion != 1 {
		t.Fatalf("member record %+v before the silent workers were replaced, want map version 1", rec)
	}
	testenv.WaitFor(t, 30*time.Second, func() bool {
		rec := e.memberRecord(t)
		return rec != nil && rec.MapVersion == 2 && len(rec.Workers) == 2 && rec.Workers[0].State == "ready" && rec.Workers[1].State == "ready"
	}, "the silent workers to be replaced by workers on map 2")
	now := h.pids()
	for _, p := range old {
		if slices.Contains(now, p) {
			t.Fatalf("silent worker %d still serving: %v -> %v", p, old, now)
		}
	}
	if n := testCounter(t, h, "shardvisor_supervisor_map_ack_timeouts_total", ""); n != 2 {
		t.Fatalf("map_ack_timeouts_total %v, want 2", n)
	}
	if m := h.sv.Status(); m.Generation != 1 {
		t.Fatalf("a silent worker's replacement is a worker of the same generation, got generation %d", m.Generation)
	}
	if r, err := get(addr); err != nil || r.MapVersion != "2" || r.Map != doc {
		t.Fatalf("replacement answered %+v %v", r, err)
	}
	l.finish(t)
}

// gunicorn (Debian's, unmodified) running examples/python/wsgi_app.py,
// which follows the map file with the shardvisor package's Router: with
// --preload the arbiter imports the app and forks its worker, and it is
// the forked worker that acknowledges each map.
func TestGunicornReloadMode(t *testing.T) {
	t.Parallel()
	gunicorn := lookTool(t, "gunicorn")
	appDir, err := filepath.Abs("../examples/python")
	if err != nil {
		t.Fatal(err)
	}
	e := startZK(t)
	_, put := mapCluster(t, e)
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	c := &topo.PoolConfig{Version: 1, Command: gunicorn, Workers: 2,
		Args:            []string{"--preload", "--workers", "1", "--chdir", appDir, "--graceful-timeout", "5", "--log-level", "warning", "wsgi_app:application"},
		Env:             map[string]string{"APP_STARTUP_DELAY": "0.2", "APP_TAG": "py"},
		Listen:          []topo.Listen{{Name: "http", Addr: "tcp://" + addr}},
		GracefulTimeout: topo.Duration(10 * time.Second),
		// The arbiter says READY=1 before it forks its worker.
		Readiness: topo.Readiness{Timeout: topo.Duration(60 * time.Second), Delay: topo.Duration(500 * time.Millisecond)}}
	reloadCfg("", 5*time.Second)(c)
	e.setConfig(t, c)
	h := run(t, e.opts(t, e.z.ConnectString+e.z.Root, 4*time.Second))
	h.waitFor(60*time.Second, "gunicorn generation 1", serving(1, 2))
	pids := h.pids()
	l := startLoad(addr, 2)
	for v := uint64(2); v <= 4; v++ {
		put(v)
		h.waitFor(20*time.Second, fmt.Sprintf("gunicorn's workers on map %d", v), onMap(v))
	}
	testenv.WaitFor(t, 20*time.Second, func() bool { m := e.memberRecord(t); return m != nil && m.MapVersion == 4 },
		"gunicorn's workers to acknowledge map 4")
	if m := h.sv.Status(); m.Generation != 1 || !slices.Equal(h.pids(), pids) {
		t.Fatalf("gunicorn restarted for map changes: generation %d, pids %v -> %v", m.Generation, pids, h.pids())
	}
	for range 6 {
		if r, err := get(addr); err != nil || r.MapVersion != "4" {
			t.Fatalf("gunicorn answered %+v %v, want map 4", r, err)
		}
	}
	if n := testCounter(t, h, "shardvisor_supervisor_map_ack_timeouts_total", ""); n != 0 {
		t.Fatalf("%v ack timeouts", n)
	}
	l.finish(t)
}
