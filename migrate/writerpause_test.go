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
	refused    bool          // SV001: the fence refused it
	gaugeUp    bool          // the frozen-bucket gauge was non-zero when it ended
	gauge      time.Duration // its value then: the oldest open pause's age
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
			err := f.r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
				a := attempt{start: time.Now()}
				_, err := pool.Exec(ctx, clustertest.KVUpsert, key, uid, v)
				a.end, a.refused, a.gauge = time.Now(), fence.IsRejected(err), met.OldestFrozen()
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
// the refused attempts.
func refusedSpan(t *testing.T, as []attempt) (time.Duration, []attempt) {
	t.Helper()
	first := -1
	for i, a := range as {
		if a.refused && first < 0 {
			first = i
		}
		if first >= 0 && !a.refused {
			return a.end.Sub(as[first].end), as[first:i]
		}
	}
	t.Fatalf("the writer saw no refusal followed by an accepted write in %d attempts", len(as))
	return 0, nil
}

// The recorded write pause is what a writer sees, with the continuous
// fence reconciler running (as docs/data-contract.md recommends) and a
// router sidecar SIGSTOPped, so that the mover waits its whole member
// wait (300 ms here) for it. The reconciler must not freeze the bucket when the map
// says moving: it did, and writers were refused for the whole member wait
// (a second here; 7.9 s in the run) while the move recorded a
// pause of 15 ms. Now the writer's refusals all come after the freeze's
// recorded start (after the member wait), its first refusal to its first
// accepted write matches the record's pause within 20 ms (checked without
// -race, which slows every goroutine several times over: `make
// test-faults` runs it so; under -race the writer's router learned the
// flip up to 20 ms late), and the frozen-bucket gauge is up at every
// refusal inside it.
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
	seen, refused := refusedSpan(t, as)
	recorded := time.Duration(rec.Stats.PauseMS * float64(time.Millisecond))
	t.Logf("writer: %d attempts, %d refused in a row over %s; recorded pause %s (%s); member wait %.0f ms",
		len(as), len(refused), seen.Round(100*time.Microsecond), recorded.Round(100*time.Microsecond), rec.Stats.DescribePause(), rec.Stats.MemberWaitMS)
	if !refused[0].end.After(*rec.FreezeStartedAt) {
		t.Fatalf("the writer was refused %s before the freeze's recorded start, after a member wait of %.0f ms", rec.FreezeStartedAt.Sub(refused[0].end), rec.Stats.MemberWaitMS)
	}
	if d := seen - recorded; !raceDetector && (d > 20*time.Millisecond || d < -20*time.Millisecond) {
		t.Fatalf("the writer was refused for %s, the move recorded a pause of %s: more than 20 ms apart", seen, recorded)
	}
	// Every refusal of the writer was in that one pause.
	for _, a := range as {
		if a.refused && (a.start.Before(refused[0].start) || a.end.After(refused[len(refused)-1].end)) {
			t.Fatalf("a refusal outside the pause: %+v", a)
		}
	}
	// The gauge was up at each refusal that ended inside the recorded
	// pause (from before the freeze to the target's commit; after it, a
	// router still learning the flip is refused for a moment more).
	pauseEnd := rec.FreezeStartedAt.Add(recorded)
	for _, a := range refused {
		if a.end.Before(pauseEnd) && !a.gaugeUp {
			t.Fatalf("the frozen-bucket gauge was 0 at a refusal %s into the pause", a.end.Sub(*rec.FreezeStartedAt))
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
	var pause float64
	for _, ph := range topo.PausePhases {
		pause += rec.Stats.Phase(ph)
	}
	// The phases are the pause but for the test's own hold.
	if unphased := rec.Stats.PauseMS - 30; pause > rec.Stats.PauseMS+1 || pause < unphased*0.5 {
		t.Fatalf("the pause's phases sum to %.1f ms, the pause was %.1f ms, 30 of them the test's hold: %s", pause, rec.Stats.PauseMS, rec.Stats.DescribePause())
	}
	f.checkClean(seeded)
}
