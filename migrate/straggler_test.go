package migrate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// gathered reads one series of a registry: a counter's value, or a
// histogram's sample count, for the series with exactly these labels.
func gathered(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// uidIn finds a user id whose bucket in m is b.
func (f *fixture) uidIn(m *bucketmap.Map, b uint32, prefix string) string {
	f.t.Helper()
	for i := range 100000 {
		uid := fmt.Sprintf("%s-%d", prefix, i)
		if m.BucketOf(f.ks, uid).Prefix == b {
			return uid
		}
	}
	f.t.Fatalf("no user id in bucket %d", b)
	return ""
}

// writeAt upserts uid's value directly on node, as a client that routed
// uid there would.
func (f *fixture) writeAt(node bucketmap.NodeID, uid string, v int64) error {
	_, err := f.conn(node).Exec(context.Background(), `INSERT INTO app.kv (bkey, uid, v) VALUES ($1, $2, $3) ON CONFLICT (bkey, uid) DO UPDATE SET v = EXCLUDED.v`,
		keystream.Key(f.ks.Prefix64(uid)), uid, v)
	return err
}

// stuckMember publishes a member record that never changes (its host
// hangs, or its app never boots): a pool member at version, and, if
// garbled, a router record that does not decode. Both go with the test's
// session.
func (f *fixture) stuckMember(version uint64, garbled bool) (pool, router string) {
	f.t.Helper()
	ctx := context.Background()
	p := f.st.Paths()
	pool = p.PoolMember("web", "stuck")
	data, err := topo.Encode(topo.PoolMember{Version: topo.PoolMemberVersion, Member: "stuck", State: "serving", MapVersion: version})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.s.CreateAll(ctx, p.PoolMembers("web")); err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.s.CreateEphemeral(ctx, pool, data, nil); err != nil {
		f.t.Fatal(err)
	}
	if garbled {
		router = p.Router("garbled")
		if _, err := f.s.CreateEphemeral(ctx, router, []byte("{not json"), nil); err != nil {
			f.t.Fatal(err)
		}
	}
	return pool, router
}

// A member stuck at an old map version, and one whose record does not
// decode, do not stop a move: it waits out the member wait, records them
// as stragglers, warns, counts them, and completes. A client of the stuck
// member, routing by the old map, is refused by the old owner's fence
// after the flip, reads the old owner's frozen copy, and writes fine once
// it routes by the new map.
func TestIntegrationStragglerDoesNotStopMove(t *testing.T) {
	f := parallelFixture(t, 2, 2) // pg1 0-1, pg2 2-3
	seeded := f.seedRows("s", 50)
	ctx := context.Background()
	old := f.mapNow()
	uid := f.uidIn(old, 0, "straggler-client")
	if err := f.write(ctx, uid, 1); err != nil {
		t.Fatal(err)
	}
	seeded[uid] = 1
	pool, router := f.stuckMember(old.Version, true)

	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.WarnLevel)
	mv := f.mover(Options{MemberWait: 500 * time.Millisecond, Metrics: NewMetrics(reg), Logger: zap.New(core)})
	defer mv.Close()
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveDone {
		t.Fatalf("move with stragglers: %v (%s, %s)", err, rec.State, rec.Error)
	}
	fenceV := rec.FenceVersion
	if len(rec.Stragglers) != 2 || rec.Stragglers[0] != (topo.Straggler{Member: pool, MapVersion: old.Version}) ||
		rec.Stragglers[1].Member != router || !strings.Contains(rec.Stragglers[1].Error, "not JSON") {
		t.Fatalf("stragglers %+v, want %s at %d and %s unreadable", rec.Stragglers, pool, old.Version, router)
	}
	if rec.Stats.MemberWaitMS <= 0 {
		t.Fatalf("member wait not recorded: %+v", rec.Stats)
	}
	t.Logf("member wait %.1f ms (--member-wait 500ms), write pause %.1f ms", rec.Stats.MemberWaitMS, rec.Stats.PauseMS)
	if saved, err := mv.Get(ctx, rec.ID); err != nil || len(saved.Stragglers) != 2 || saved.Stats.MemberWaitMS != rec.Stats.MemberWaitMS {
		t.Fatalf("saved record: %+v %v", saved, err)
	}
	for _, kind := range []string{"router", "supervisor"} {
		if n := gathered(t, reg, "shardvisor_move_stragglers_total", map[string]string{"kind": kind, "action": StragglerProceed}); n != 1 {
			t.Fatalf("shardvisor_move_stragglers_total{kind=%q} = %v, want 1", kind, n)
		}
	}
	if n := gathered(t, reg, "shardvisor_move_member_wait_seconds", nil); n != 1 {
		t.Fatalf("member wait observed %v times, want 1", n)
	}
	warned := map[string]bool{}
	for _, e := range logs.FilterMessageSnippet("straggler").All() {
		fields := e.ContextMap()
		if fields["fence_map_version"] == fenceV {
			warned[fmt.Sprintf("%v@%v", fields["member"], fields["member_map_version"])] = true
		}
	}
	if !warned[fmt.Sprintf("%s@%d", pool, old.Version)] || !warned[router+"@0"] {
		t.Fatalf("warnings %v do not name each straggler with its map version", warned)
	}

	// The straggler's client, routing by the old map, writes to pg1: the
	// fence refuses (SV001); it still reads the frozen copy there.
	if old.Owner(0) != "pg1" {
		t.Fatalf("bucket 0 was on %s", old.Owner(0))
	}
	err = f.writeAt("pg1", uid, 2)
	if !fence.IsRejected(err) || !strings.Contains(err.Error(), "SV001") {
		t.Fatalf("a straggler's write to the old owner after the flip: %v, want SV001", err)
	}
	var v int64
	if err := f.conn("pg1").QueryRow(ctx, "SELECT v FROM app.kv WHERE bkey = $1 AND uid = $2", keystream.Key(f.ks.Prefix64(uid)), uid).Scan(&v); err != nil || v != 1 {
		t.Fatalf("read on the old owner until GC: %d %v", v, err)
	}
	// Caught up: the new map routes it to pg2, where the write succeeds.
	now := f.mapNow()
	if owner := now.OwnerOf(now.BucketOf(f.ks, uid)); owner != "pg2" {
		t.Fatalf("new map routes %s to %s", uid, owner)
	}
	if err := f.writeAt("pg2", uid, 2); err != nil {
		t.Fatalf("write routed by the new map: %v", err)
	}
	seeded[uid] = 2
	f.checkClean(seeded)
}

// --on-straggler=abort keeps the behaviour of movers before it: the move
// aborts, names the straggler, and changes nothing; the straggler is in
// the record and counted.
func TestIntegrationStragglerAbort(t *testing.T) {
	f := parallelFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	ctx := context.Background()
	old := f.mapNow()
	pool, _ := f.stuckMember(old.Version, false)
	reg := prometheus.NewRegistry()
	if _, err := f.mover(Options{OnStraggler: "sometimes"}).Move(ctx, 0, "pg2", false); err == nil || !strings.Contains(err.Error(), `on-straggler "sometimes"`) {
		t.Fatalf("a bad OnStraggler: %v", err)
	}
	if list, _ := f.mover(Options{}).List(ctx); len(list) != 0 {
		t.Fatalf("a refused move left records: %+v", list)
	}
	mv := f.mover(Options{MemberWait: 300 * time.Millisecond, OnStraggler: StragglerAbort, Metrics: NewMetrics(reg)})
	defer mv.Close()
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err == nil || rec.State != topo.MoveAborted || !strings.Contains(err.Error(), pool) || !strings.Contains(rec.Error, "have not applied map version") {
		t.Fatalf("move with a straggler and abort: %v (%s, %q)", err, rec.State, rec.Error)
	}
	if len(rec.Stragglers) != 1 || rec.Stragglers[0].Member != pool {
		t.Fatalf("stragglers %+v", rec.Stragglers)
	}
	if n := gathered(t, reg, "shardvisor_move_stragglers_total", map[string]string{"kind": "supervisor", "action": StragglerAbort}); n != 1 {
		t.Fatalf("stragglers counted %v, want 1", n)
	}
	if m := f.mapNow(); m.Owner(0) != "pg1" {
		t.Fatalf("an aborted move gave bucket 0 to %s", m.Owner(0))
	}
	f.checkClean(seeded)
}

// routerSidecar is cmd/router, built once per test binary.
func routerSidecar(t *testing.T) string { return builtBin(t, "router") }

// sidecar is a real router sidecar (cmd/router) of the fixture's cluster.
type sidecar struct {
	t       *testing.T
	cmd     *exec.Cmd
	addr    string
	stopped bool
}

// startSidecar starts a router sidecar named id and waits until it has
// applied the current map. Its session is long enough that, stopped, it
// keeps its member record for the whole move: a straggler, not a dead
// host.
func (f *fixture) startSidecar(id string) *sidecar {
	f.t.Helper()
	sc := &sidecar{t: f.t}
	sc.cmd = exec.Command(routerSidecar(f.t), "--zk", f.z.ConnectString, "--zk-root", f.z.Root, "--cluster", "mv", "--listen", "127.0.0.1:0",
		"--id", id, "--zk-session-timeout", "20s", "--log-level", "warn")
	var logs strings.Builder
	sc.cmd.Stdout, sc.cmd.Stderr = &logs, &logs
	if err := sc.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		if sc.stopped {
			_ = sc.cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = sc.cmd.Process.Signal(syscall.SIGTERM)
		_ = sc.cmd.Wait()
		if f.t.Failed() {
			f.t.Logf("router sidecar output:\n%s", logs.String())
		}
	})
	sc.addr = f.sidecarAt(id, f.mapNow().Version).Addr
	return sc
}

// stop sends SIGSTOP and waits until every thread has stopped: kill
// returns with the signal queued, and a running thread could still
// acknowledge a new map before every thread stops.
func (sc *sidecar) stop() {
	sc.t.Helper()
	if err := sc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		sc.t.Fatal(err)
	}
	sc.stopped = true
	if !devenv.WaitStopped(sc.cmd.Process.Pid, 5*time.Second) {
		sc.t.Fatal("the sidecar did not stop within 5 s of SIGSTOP")
	}
}

// cont sends SIGCONT.
func (sc *sidecar) cont() {
	sc.t.Helper()
	if err := sc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		sc.t.Fatal(err)
	}
	sc.stopped = false
}

// routeOf asks a router sidecar for uid's route.
func routeOf(t *testing.T, addr, uid string) (node string, version uint64) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/v1/route?uid=" + uid)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rt struct {
		Node       string `json:"node"`
		MapVersion uint64 `json:"map_version"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rt); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/route: %s %v", resp.Status, err)
	}
	return rt.Node, rt.MapVersion
}

// sidecarAt waits for the sidecar's member record to reach version and
// returns it.
func (f *fixture) sidecarAt(id string, version uint64) *topo.RouterMember {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		routers, err := topo.ListRouters(context.Background(), f.s, f.st.Paths())
		if err != nil {
			f.t.Fatal(err)
		}
		for _, e := range routers {
			if e.Name == id && e.Rec != nil && e.Rec.MapVersion >= version {
				return e.Rec
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("router %s never applied map version %d: %+v", id, version, routers)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A real router sidecar, stopped with SIGSTOP during a move, is named as
// the move's straggler and does not stop it. Its app had asked it for a
// route before: the write there is refused by the fence. Continued with
// SIGCONT, the sidecar catches up, and the app's next route leads to the
// new owner, where the write succeeds.
func TestIntegrationStoppedRouterSidecar(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	ctx := context.Background()
	old := f.mapNow()
	sc := f.startSidecar("sidecar")
	addr := sc.addr
	uid := f.uidIn(old, 0, "sidecar-client")
	if node, _ := routeOf(t, addr, uid); node != "pg1" {
		t.Fatalf("sidecar routes %s to %s before the move, want pg1", uid, node)
	}
	sc.stop()
	reg := prometheus.NewRegistry()
	mv := f.mover(Options{MemberWait: time.Second, Metrics: NewMetrics(reg)})
	defer mv.Close()
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveDone {
		t.Fatalf("move with a stopped sidecar: %v (%s, %s)", err, rec.State, rec.Error)
	}
	want := topo.Straggler{Member: f.st.Paths().Router("sidecar"), MapVersion: old.Version}
	if len(rec.Stragglers) != 1 || rec.Stragglers[0] != want {
		t.Fatalf("stragglers %+v, want only %+v (the in-process router is live)", rec.Stragglers, want)
	}
	if n := gathered(t, reg, "shardvisor_move_stragglers_total", map[string]string{"kind": "router", "action": StragglerProceed}); n != 1 {
		t.Fatalf("stragglers counted %v, want 1", n)
	}
	// The app writes where its sidecar last said: refused.
	if err := f.writeAt("pg1", uid, 1); !fence.IsRejected(err) {
		t.Fatalf("write at the route of the stopped sidecar: %v, want SV001", err)
	}

	sc.cont()
	f.sidecarAt("sidecar", rec.FlipVersion)
	node, version := routeOf(t, addr, uid)
	if node != "pg2" || version < rec.FlipVersion {
		t.Fatalf("sidecar after SIGCONT routes %s to %s at map version %d, want pg2 at %d or later", uid, node, version, rec.FlipVersion)
	}
	if err := f.writeAt(bucketmap.NodeID(node), uid, 1); err != nil {
		t.Fatalf("write at the caught-up route: %v", err)
	}
	seeded[uid] = 1
	f.checkClean(seeded)
}
