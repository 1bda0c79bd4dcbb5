package migrate

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardvisor/shardvisor/fence"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
)

// attempt is one write a writer sent, as it saw it.
type attempt struct {
	start, end time.Time
	node       string        // the node the router sent it to
	refused    bool          // SV001: the fence refused it
	gaugeUp    bool          // the frozen-bucket gauge was non-zero when it ended
	gauge      time.Duration // its value then: the oldest open pause's age
	gaugeAt    time.Time     // just after the gauge was read
}

// pauseWriter writes one user's row through the fixture's router, one
// write after another, and keeps every attempt (router.Do's retries
// included), sampling the frozen-bucket gauge as each ends.
type pauseWriter struct {
	mu       sync.Mutex
	attempts []attempt
	errs     []error
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func (f *fixture) startPauseWriter(uid string, met *Metrics) *pauseWriter {
	w := &pauseWriter{stop: make(chan struct{}), done: make(chan struct{})}
	f.t.Cleanup(w.halt) // a test that fails before finish
	key := keystream.Key(f.ks.Prefix64(uid))
	go func() {
		defer close(w.done)
		for v := int64(1); ; v++ {
			select {
			case <-w.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := f.r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, rt router.Route) error {
				a := attempt{start: time.Now(), node: string(rt.Node)}
				_, err := pool.Exec(ctx, clustertest.KVUpsert, key, uid, v)
				a.end, a.refused, a.gauge = time.Now(), fence.IsRejected(err), met.OldestFrozen()
				a.gaugeAt = time.Now()
				a.gaugeUp = a.gauge > 0
				w.mu.Lock()
				w.attempts = append(w.attempts, a)
				w.mu.Unlock()
				return err
			})
			cancel()
			if err != nil {
				w.mu.Lock()
				w.errs = append(w.errs, err)
				w.mu.Unlock()
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return w
}

// inBackground runs each fn on a goroutine of its own until the test
// ends, then cancels their context and waits for them.
func (f *fixture) inBackground(fns ...func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, fn := range fns {
		wg.Add(1)
		go func() { defer wg.Done(); fn(ctx) }()
	}
	f.t.Cleanup(func() { cancel(); wg.Wait() })
}

// reconciler is the continuous fence reconciler (`node reconcile
// --watch`), for inBackground.
func (f *fixture) reconciler(ctx context.Context) {
	_ = fence.Watch(ctx, f.st, nil, fence.WatchOptions{Retry: 100 * time.Millisecond})
}

// halt stops the writer and waits for it.
func (w *pauseWriter) halt() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

// finish stops the writer and returns its attempts.
func (w *pauseWriter) finish(t *testing.T) []attempt {
	w.halt()
	if err := errors.Join(w.errs...); err != nil {
		t.Fatalf("the writer got errors (router.Do retries refusals): %v", err)
	}
	return w.attempts
}

// refusedSpan is what the writer saw of the pause: from its first refusal
// to its first accepted write after it, each when its answer came, with
// the refused attempts and that accepted write.
func refusedSpan(t *testing.T, as []attempt) (time.Duration, []attempt, attempt) {
	t.Helper()
	first := -1
	for i, a := range as {
		if a.refused && first < 0 {
			first = i
		}
		if first >= 0 && !a.refused {
			return a.end.Sub(as[first].end), as[first:i], a
		}
	}
	t.Fatalf("the writer saw no refusal followed by an accepted write in %d attempts", len(as))
	return 0, nil, attempt{}
}

// The recorded write pause is what a writer sees, with the continuous
// fence reconciler running (as docs/data-contract.md recommends) and a
// router sidecar SIGSTOPped, so that the mover waits its whole member
// wait (300 ms here) for it. The reconciler must not freeze the bucket
// when the map says moving: it did, and writers were refused for the
// whole member wait (a second here; 7.9 s in the run) while the
// move recorded a pause of 15 ms. Now the writer's refusals all come
// after the freeze's recorded start (after the member wait), in one run
// that ends with a write to the target, and the frozen-bucket gauge is up
// at every refusal read inside the recorded pause. Only orderings are
// asserted: how much longer than the record the writer was refused (its
// router learning the flip) depends on how the machine schedules it,
// and is logged.
func TestIntegrationPauseIsWhatWritersSee(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2, 2)
	seeded := f.seedRows("s", 50)
	ctx := context.Background()
	old := f.mapNow()
	sc := f.startSidecar("stuck")
	sc.stop()
	f.inBackground(f.reconciler)

	uid := f.uidIn(old, 0, "paused-writer")
	met := NewMetrics(prometheus.NewRegistry())
	w := f.startPauseWriter(uid, met)
	time.Sleep(200 * time.Millisecond) // writes before the move
	const memberWait = 300 * time.Millisecond
	// 30 ms more inside the pause (entering the barrier), so that the
	// writer, one write a millisecond or so, surely meets it however the
	// machine schedules it; the record counts them like any others.
	hold := func(p Progress) {
		if p.Message == topo.MoveBarrier {
			time.Sleep(30 * time.Millisecond)
		}
	}
	mv := f.mover(Options{MemberWait: memberWait, Metrics: met, Progress: hold})
	defer mv.Close()
	rec, err := mv.Move(ctx, 0, "pg2", false)
	if err != nil || rec.State != topo.MoveDone {
		t.Fatalf("move: %v (%s, %s)", err, rec.State, rec.Error)
	}
	time.Sleep(200 * time.Millisecond) // writes after it
	as := w.finish(t)
	sc.cont()

	if len(rec.Stragglers) != 1 || rec.Stats.MemberWaitMS < float64(memberWait.Milliseconds()) {
		t.Fatalf("the stopped sidecar was not waited for: stragglers %+v, member wait %.1f ms", rec.Stragglers, rec.Stats.MemberWaitMS)
	}
	seen, refused, accepted := refusedSpan(t, as)
	recorded := time.Duration(rec.Stats.PauseMS * float64(time.Millisecond))
	// pauseEnd is at or before the pause's real end: the record keeps
	// when the freeze's start was saved, a little before it was sent.
	pauseEnd := rec.FreezeStartedAt.Add(recorded)
	late := 0
	for _, a := range refused {
		if a.start.After(pauseEnd) {
			late++
		}
	}
	t.Logf("writer: %d attempts, %d refused in a row over %s (%d sent after the recorded pause, to a route not yet flipped); recorded pause %s (%s); member wait %.0f ms",
		len(as), len(refused), seen.Round(100*time.Microsecond), late, recorded.Round(100*time.Microsecond), rec.Stats.DescribePause(), rec.Stats.MemberWaitMS)
	if !refused[0].end.After(*rec.FreezeStartedAt) {
		t.Fatalf("the writer was refused %s before the freeze's recorded start, after a member wait of %.0f ms", rec.FreezeStartedAt.Sub(refused[0].end), rec.Stats.MemberWaitMS)
	}
	if src := string(old.OwnerOf(old.BucketOf(f.ks, uid))); refused[0].node != src || accepted.node != "pg2" {
		t.Fatalf("the writer's refusals began on %s and ended with a write to %s, want the source %s then the target pg2", refused[0].node, accepted.node, src)
	}
	// Every refusal of the writer was in that one pause.
	for _, a := range as {
		if a.refused && (a.start.Before(refused[0].start) || a.end.After(refused[len(refused)-1].end)) {
			t.Fatalf("a refusal outside the pause: %+v", a)
		}
	}
	// The gauge was up at each refusal read inside the recorded
	// pause (from before the freeze to the target's commit; after it, a
	// router still learning the flip is refused for a moment more).
	for _, a := range refused {
		if a.gaugeAt.Before(pauseEnd) && !a.gaugeUp {
			t.Fatalf("the frozen-bucket gauge was 0 at a refusal %s into the pause", a.gaugeAt.Sub(*rec.FreezeStartedAt))
		}
	}
	if met.OldestFrozen() != 0 {
		t.Fatalf("the gauge is still up after the move: %s", met.OldestFrozen())
	}
	for _, ph := range []string{topo.PhaseSlot, topo.PhaseCopy, topo.PhaseMemberWait, topo.PhaseFreeze, topo.PhaseApply, topo.PhaseFlip, topo.PhaseOwn} {
		if rec.Stats.Phase(ph) <= 0 {
			t.Fatalf("phase %s not timed: %+v", ph, rec.Stats.Phases)
		}
	}
	f.checkClean(seeded)
}
