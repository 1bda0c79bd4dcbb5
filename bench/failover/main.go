// Command failover-bench measures what a db node's primary dying costs
// the application (issue 22). Run it with bench/failover/run, which starts
// a throwaway environment first: a 3-server ZooKeeper ensemble and one db
// node that is a Patroni group of a primary and a standby (DCS on that
// ensemble, ttl 10 s, loop_wait 2 s, retry_timeout 4 s).
//
// In one run, for each mode (synchronous_mode on, then off: the baseline
// PostgreSQL users get without it), KILLS times:
//
//  1. the group is whole (a leader, the other member streaming; in sync
//     mode, the synchronous standby set);
//  2. WRITERS goroutines insert rows with client-chosen ids through
//     router.Do, as the fleet's workers do, recording every acknowledged
//     id; a write whose outcome is unknown (the connection died after the
//     statement was sent) is retried with the same id (INSERT ... ON
//     CONFLICT DO NOTHING): a retry that finds the row counts a
//     "duplicate", a commit whose acknowledgement was lost;
//  3. after a steady period, the primary's postmaster, its children and
//     its Patroni are SIGKILLed at once (devenv's PGKill, in-process);
//  4. it measures the kill to Patroni's new leader key (watched in
//     ZooKeeper), to the first acknowledged write, and from the election
//     to that write; and write latency p99 before, during (kill to first
//     write + 1 s) and after;
//  5. the killed member is started again and must rejoin as a standby
//     with no hand work before the next kill.
//
// At the end every acknowledged id is looked up on the current primary:
// lost writes are the ones missing. Each figure is printed for both
// modes, async as a ratio of sync, from the same run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

var (
	kills     = flag.Int("kills", 10, "primary SIGKILLs per mode, each after the old primary rejoined")
	writers   = flag.Int("writers", 16, "writer goroutines")
	rate      = flag.Int("rate", 2000, "total writes/s offered (0: as fast as the writers go; a 2-core box then makes WAL faster than a rejoined standby replays it)")
	steady    = flag.Duration("steady", 3*time.Second, "write load before each kill (the 'before' window) and after the 'during' window")
	modes     = flag.String("modes", "sync,async", "modes to run, in order: sync (synchronous_mode on) and/or async")
	node      = flag.Int("node", 1, "the scripts/devenv node number of the group")
	jsonOut   = flag.Bool("json", false, "print the summary as JSON on stdout (the report goes to stderr)")
	rejoinTO  = flag.Duration("rejoin-timeout", 3*time.Minute, "how long the killed member may take to rejoin")
	returning = flag.Bool("returning", false, "write with INSERT ... RETURNING read through QueryRow (as the notes app does) instead of Exec")
	zkOutage  = flag.Duration("zk-outage", 0, "before each kill, stop the whole ZooKeeper ensemble this long (Patroni's failsafe mode keeps the primary)")
)

// Failover is one kill.
type Failover struct {
	Killed         string  `json:"killed"`
	NewLeader      string  `json:"new_leader"`
	ElectedMS      float64 `json:"elected_ms"`        // kill -> new leader key
	FirstWriteMS   float64 `json:"first_write_ms"`    // kill -> first acknowledged write
	AfterElectMS   float64 `json:"after_election_ms"` // new leader key -> first acknowledged write
	RejoinS        float64 `json:"rejoin_s"`          // pg-start -> streaming again
	FailedInFlight int64   `json:"failed"`            // writes that gave up in this failover
}

// Mode is one mode's figures.
type Mode struct {
	Name         string        `json:"mode"`
	Failovers    []Failover    `json:"failovers"`
	Acked        int64         `json:"acknowledged_writes"`
	Lost         int64         `json:"lost_acknowledged_writes"`
	Duplicates   int64         `json:"duplicates"`
	Failed       int64         `json:"failed_writes"`
	Elected      benchkit.Stat `json:"elected_ms"`
	FirstWrite   benchkit.Stat `json:"first_write_ms"`
	AfterElect   benchkit.Stat `json:"after_election_ms"`
	P99BeforeMS  float64       `json:"p99_before_ms"`
	P99DuringMS  float64       `json:"p99_during_ms"`
	P99AfterMS   float64       `json:"p99_after_ms"`
	WritesPerSec float64       `json:"writes_per_s_steady"`
}

// Summary is the whole run.
type Summary struct {
	Modes []*Mode `json:"modes"`
	Error string  `json:"error,omitempty"`
}

type env struct {
	zk, dsn, pwFile, scope, ns string
	apiPorts                   []int
	devenv                     *devenv.Env // the environment bench/failover/run started, in this process
}

func main() {
	flag.Parse()
	p := &benchkit.Printer{Stamp: true}
	if *jsonOut {
		p.W = os.Stderr
	}
	sum := &Summary{}
	err := run(p, sum)
	benchkit.Finish("failover-bench", sum, err, func(s *Summary, e string) { s.Error = e }, func(s *Summary) { report(p, s) }, *jsonOut)
}

func readEnv() (*env, error) {
	cfg, err := devenv.FromEnv()
	if err != nil {
		return nil, err
	}
	cfg.Log = nil // its errors carry the servers' log tails
	e := &env{zk: os.Getenv("SHARDVISOR_ZK"), pwFile: os.Getenv("SHARDVISOR_PG_PASSWORD_FILE"), devenv: devenv.New(cfg)}
	n := strconv.Itoa(*node)
	e.dsn = os.Getenv("SHARDVISOR_PG" + n + "_DSN")
	e.scope = os.Getenv("SHARDVISOR_PG" + n + "_PATRONI_SCOPE")
	e.ns = benchkit.EnvOr("SHARDVISOR_PG"+n+"_PATRONI_NAMESPACE", bucketmap.DefaultPatroniNamespace)
	if e.zk == "" || e.dsn == "" || e.scope == "" {
		return nil, fmt.Errorf("run it through bench/failover/run (SHARDVISOR_ZK, SHARDVISOR_PG%s_DSN and SHARDVISOR_PG%s_PATRONI_SCOPE from scripts/devenv env)", n, n)
	}
	base := benchkit.EnvInt("SHARDVISOR_PG_PORT_BASE", 25432)
	for m := 1; m <= 2; m++ {
		e.apiPorts = append(e.apiPorts, base+1000+*node-1+100*(m-1))
	}
	return e, nil
}

// ledger is every write's fate.
type ledger struct {
	mu         sync.Mutex
	acked      []int64
	failed     atomic.Int64
	duplicates atomic.Int64
	lat        []sample
}

type sample struct {
	at  time.Time // when the write was acknowledged
	dur time.Duration
}

func run(p *benchkit.Printer, sum *Summary) error {
	e, err := readEnv()
	if err != nil {
		return err
	}
	ctx, cancel := benchkit.Context()
	defer cancel()
	s, err := zksession.Open(zksession.Config{Connect: e.zk, SessionTimeout: 4 * time.Second})
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.WaitConnected(ctx); err != nil {
		return err
	}
	root := fmt.Sprintf("/shardvisor-bench/failover-%d", time.Now().UnixNano())
	// The DSN from devenv carries the password; the registry takes a
	// reference instead.
	dsn, err := stripPassword(e.dsn)
	if err != nil {
		return err
	}
	g := bucketmap.Node{ID: "g1", DSN: dsn, Password: "file:" + e.pwFile, Weight: 1, State: bucketmap.NodeActive,
		Patroni: bucketmap.Patroni{Namespace: e.ns, Scope: e.scope}}
	c, err := clustertest.Build(ctx, s, clustertest.Spec{Root: root, Name: "fo", Level: 2, Nodes: []bucketmap.Node{g}, NoFence: true,
		DDL: []string{`DROP TABLE IF EXISTS bench_failover; CREATE TABLE bench_failover (bkey bigint NOT NULL, id bigint NOT NULL, at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (bkey, id))`}})
	defer topo.DeleteRoot(context.Background(), s, topo.MustPaths(root, "fo"))
	if err != nil {
		return err
	}
	st, ks := c.Store, c.Keystream
	r := router.New(s, st.Paths(), router.Options{MemberID: "failover-bench", TunePool: func(c *pgxpool.Config) { c.MaxConns = int32(*writers) }})
	defer r.Close()
	if err := r.WaitReady(ctx); err != nil {
		return err
	}

	for _, name := range strings.Split(*modes, ",") {
		mode := &Mode{Name: name}
		sum.Modes = append(sum.Modes, mode)
		if err := setMode(ctx, p, e, s, name); err != nil {
			return err
		}
		if err := runMode(ctx, p, e, s, r, ks, mode); err != nil {
			return err
		}
	}
	return nil
}

func stripPassword(dsn string) (string, error) {
	i := strings.Index(dsn, "://")
	at := strings.Index(dsn, "@")
	if i < 0 || at < 0 {
		return "", fmt.Errorf("unexpected DSN form")
	}
	user := dsn[i+3 : at]
	if c := strings.Index(user, ":"); c >= 0 {
		user = user[:c]
	}
	return dsn[:i+3] + user + dsn[at:], nil
}

// setMode turns synchronous_mode on or off through Patroni's REST API
// (PATCH /config, which any member accepts) and waits for the group to
// be whole in that mode.
func setMode(ctx context.Context, p *benchkit.Printer, e *env, s *zksession.Session, mode string) error {
	body := fmt.Sprintf(`{"synchronous_mode": %v}`, mode == "sync")
	var last error
	for _, port := range e.apiPorts {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPatch, fmt.Sprintf("http://127.0.0.1:%d/config", port), strings.NewReader(body))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			last = err
			continue
		}
		res.Body.Close()
		if res.StatusCode == 200 {
			last = nil
			break
		}
		last = fmt.Errorf("PATCH /config: %s", res.Status)
	}
	if last != nil {
		return last
	}
	p.Say("mode %s: synchronous_mode %v", mode, mode == "sync")
	_, err := waitWhole(ctx, e, s, mode == "sync", 2*time.Minute)
	return err
}

// waitWhole waits until the group has a leader and the other member runs
// (and, in sync mode, is the synchronous standby).
func waitWhole(ctx context.Context, e *env, s *zksession.Session, sync bool, timeout time.Duration) (*topo.PatroniGroup, error) {
	deadline := time.Now().Add(timeout)
	for {
		g, err := topo.ReadPatroni(ctx, s, e.ns, e.scope)
		if err == nil && g.Leader != "" && len(g.Members) == 2 && g.Config != nil && g.Config.SynchronousMode == sync {
			ok := true
			for _, m := range g.Members {
				if !m.Leader && (m.State != "running" && m.State != "streaming" || sync && !m.Sync) {
					ok = false
				}
			}
			if ok {
				return g, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("group %s not whole after %s (sync=%v): %+v %v", e.scope, timeout, sync, g, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func runMode(ctx context.Context, p *benchkit.Printer, e *env, s *zksession.Session, r *router.Router, ks *keystream.Keystream, mode *Mode) error {
	led := &ledger{}
	var nextID atomic.Int64
	nextID.Store(time.Now().UnixNano())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < *writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pace *benchkit.Pacer
			if *rate > 0 {
				pace = benchkit.NewPacer(time.Duration(float64(time.Second) * float64(*writers) / float64(*rate)))
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				if pace != nil && !pace.Wait(stop) {
					return
				}
				id := nextID.Add(1)
				write(ctx, r, ks, led, id)
			}
		}()
	}
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			wg.Wait()
		}
	}()

	var befores, durings, afters []time.Duration
	var steadyWrites int64
	var steadyTime time.Duration
	for k := 1; k <= *kills; k++ {
		g, err := waitWhole(ctx, e, s, mode.Name == "sync", 2*time.Minute)
		if err != nil {
			return err
		}
		if *zkOutage > 0 {
			p.Say("%s kill %d/%d: the whole ZooKeeper ensemble down for %s first", mode.Name, k, *kills, *zkOutage)
			for z := 1; z <= 3; z++ {
				if err := e.devenv.ZKKill(z); err != nil {
					return fmt.Errorf("zk-kill: %v", err)
				}
			}
			time.Sleep(*zkOutage)
			if err := e.devenv.Up(); err != nil {
				return fmt.Errorf("devenv up after the outage: %v", err)
			}
			if g, err = waitWhole(ctx, e, s, mode.Name == "sync", 2*time.Minute); err != nil {
				return err
			}
		}
		n0, t0 := ackedCount(led), time.Now()
		time.Sleep(*steady)
		steadyWrites += ackedCount(led) - n0
		steadyTime += time.Since(t0)
		failed0 := led.failed.Load()
		_, err = e.devenv.PGKill(*node)
		kill := time.Now()
		if err != nil {
			return fmt.Errorf("pg-kill: %v", err)
		}
		fo := Failover{Killed: g.Leader}
		// The new leader key, polled every 2 ms (one read each): the old
		// key lives until the old leader's session expires (ttl).
		var elected time.Time
		for elected.IsZero() {
			leader, err := topo.ReadPatroniLeader(ctx, s, e.ns, e.scope)
			if err == nil && leader != "" && leader != g.Leader {
				elected, fo.NewLeader = time.Now(), leader
				break
			}
			if time.Since(kill) > 2*time.Minute {
				return fmt.Errorf("no new leader 2 min after killing %s", g.Leader)
			}
			time.Sleep(2 * time.Millisecond)
		}
		first := firstAckAfter(led, kill, 2*time.Minute)
		if first.IsZero() {
			return fmt.Errorf("no acknowledged write 2 min after killing %s", g.Leader)
		}
		time.Sleep(time.Second + *steady)
		fo.ElectedMS = benchkit.MS(elected.Sub(kill))
		fo.FirstWriteMS = benchkit.MS(first.Sub(kill))
		fo.AfterElectMS = benchkit.MS(first.Sub(elected))
		fo.FailedInFlight = led.failed.Load() - failed0
		b, d, a := windows(led, kill, first)
		befores, durings, afters = append(befores, b...), append(durings, d...), append(afters, a...)
		rs := time.Now()
		if err := e.devenv.PGStart(*node); err != nil {
			return fmt.Errorf("pg-start: %v", err)
		}
		if _, err := waitWhole(ctx, e, s, mode.Name == "sync", *rejoinTO); err != nil {
			return fmt.Errorf("the killed member did not rejoin: %w", err)
		}
		fo.RejoinS = time.Since(rs).Seconds()
		mode.Failovers = append(mode.Failovers, fo)
		p.Say("%s kill %d/%d: %s killed, %s elected after %.0f ms, first acknowledged write after %.0f ms (%.0f ms after the election), %d writes gave up; rejoined in %.1f s",
			mode.Name, k, *kills, fo.Killed, fo.NewLeader, fo.ElectedMS, fo.FirstWriteMS, fo.AfterElectMS, fo.FailedInFlight, fo.RejoinS)
	}
	close(stop)
	wg.Wait()
	stopped = true
	// Every acknowledged id on the current primary.
	lost, err := lostWrites(ctx, r, led)
	if err != nil {
		return err
	}
	mode.Acked, mode.Lost = int64(len(led.acked)), lost
	mode.Duplicates, mode.Failed = led.duplicates.Load(), led.failed.Load()
	var el, fw, ae []float64
	for _, f := range mode.Failovers {
		el, fw, ae = append(el, f.ElectedMS), append(fw, f.FirstWriteMS), append(ae, f.AfterElectMS)
	}
	mode.Elected, mode.FirstWrite, mode.AfterElect = benchkit.Of(el), benchkit.Of(fw), benchkit.Of(ae)
	mode.P99BeforeMS, mode.P99DuringMS, mode.P99AfterMS = p99(befores), p99(durings), p99(afters)
	if steadyTime > 0 {
		mode.WritesPerSec = float64(steadyWrites) / steadyTime.Seconds()
	}
	return nil
}

// write inserts one row with id through router.Do. An error after the
// statement was sent leaves the outcome unknown: the same id is retried
// (ON CONFLICT DO NOTHING), and a retry that finds it committed counts a
// duplicate.
func write(ctx context.Context, r *router.Router, ks *keystream.Keystream, led *ledger, id int64) {
	uid := "u" + strconv.FormatInt(id%100000, 10)
	key := keystream.Key(ks.Prefix64(uid))
	unknown := false
	for attempt := 0; attempt < 100; attempt++ {
		start := time.Now()
		var inserted int64
		err := r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
			if *returning {
				var at time.Time
				err := pool.QueryRow(ctx, `INSERT INTO bench_failover (bkey, id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING at`, key, id).Scan(&at)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil // it was there: inserted stays 0
				}
				if err == nil {
					inserted = 1
				}
				return err
			}
			tag, err := pool.Exec(ctx, `INSERT INTO bench_failover (bkey, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, key, id)
			inserted = tag.RowsAffected()
			return err
		})
		if err == nil {
			now := time.Now()
			led.mu.Lock()
			led.acked = append(led.acked, id)
			led.lat = append(led.lat, sample{at: now, dur: now.Sub(start)})
			led.mu.Unlock()
			if unknown && inserted == 0 {
				led.duplicates.Add(1)
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, router.ErrNoPrimary) || router.Retryable(err) {
			// Never sent: nothing committed. Count the give-up and
			// try the same id again (the app would).
			led.failed.Add(1)
			continue
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			led.failed.Add(1)
			return
		}
		// Sent, then the connection died: unknown outcome.
		unknown = true
		led.failed.Add(1)
		time.Sleep(10 * time.Millisecond)
	}
}

func ackedCount(led *ledger) int64 {
	led.mu.Lock()
	defer led.mu.Unlock()
	return int64(len(led.acked))
}

func firstAckAfter(led *ledger, kill time.Time, within time.Duration) time.Time {
	deadline := kill.Add(within)
	for time.Now().Before(deadline) {
		led.mu.Lock()
		for i := len(led.lat) - 1; i >= 0 && led.lat[i].at.After(kill); i-- {
			// The earliest acknowledgement after the kill by a write
			// that started after the kill: earlier ones may have been
			// acknowledged by the dying primary just before.
			if led.lat[i].at.Add(-led.lat[i].dur).After(kill) {
				first := led.lat[i].at
				for j := i - 1; j >= 0 && led.lat[j].at.After(kill); j-- {
					if led.lat[j].at.Add(-led.lat[j].dur).After(kill) && led.lat[j].at.Before(first) {
						first = led.lat[j].at
					}
				}
				led.mu.Unlock()
				return first
			}
		}
		led.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	return time.Time{}
}

// windows splits the latencies: before the kill (steady), during (kill
// to the first write + 1 s) and after (the steady period after that).
func windows(led *ledger, kill, first time.Time) (b, d, a []time.Duration) {
	led.mu.Lock()
	defer led.mu.Unlock()
	duringEnd := first.Add(time.Second)
	for _, s := range led.lat {
		switch {
		case s.at.After(kill.Add(-*steady)) && !s.at.After(kill):
			b = append(b, s.dur)
		case s.at.After(kill) && !s.at.After(duringEnd):
			d = append(d, s.dur)
		case s.at.After(duringEnd) && !s.at.After(duringEnd.Add(*steady)):
			a = append(a, s.dur)
		}
	}
	return b, d, a
}

// p99 is the latencies' 99th percentile in ms, benchkit's (nearest rank);
// 0 when there are none.
func p99(ds []time.Duration) float64 { return benchkit.OfDurations(ds).P99 }

func lostWrites(ctx context.Context, r *router.Router, led *ledger) (int64, error) {
	pool, err := r.NodePool(ctx, "g1")
	if err != nil {
		return 0, err
	}
	rows, err := pool.Query(ctx, `SELECT id FROM bench_failover`)
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, err
	}
	have := make(map[int64]bool, len(ids))
	for _, id := range ids {
		have[id] = true
	}
	var lost int64
	for _, id := range led.acked {
		if !have[id] {
			lost++
		}
	}
	return lost, nil
}

func report(p *benchkit.Printer, s *Summary) {
	var sync, async *Mode
	for _, m := range s.Modes {
		p.Say("== %s: %d failovers, %d acknowledged writes, %d LOST, %d duplicates (commits whose acknowledgement was lost), %d writes gave up or failed",
			m.Name, len(m.Failovers), m.Acked, m.Lost, m.Duplicates, m.Failed)
		p.Say("   kill -> new leader: p50 %.0f ms, max %.0f ms; kill -> first acknowledged write: p50 %.0f ms, max %.0f ms; election -> first write: p50 %.0f ms, max %.0f ms",
			m.Elected.P50, m.Elected.Max, m.FirstWrite.P50, m.FirstWrite.Max, m.AfterElect.P50, m.AfterElect.Max)
		p.Say("   write p99: before %.1f ms, during %.1f ms, after %.1f ms; steady %.0f writes/s", m.P99BeforeMS, m.P99DuringMS, m.P99AfterMS, m.WritesPerSec)
		switch m.Name {
		case "sync":
			sync = m
		case "async":
			async = m
		}
	}
	if sync != nil && async != nil {
		p.Say("async / sync, same run: first write after kill %s, p99 before %s, writes/s %s, lost %d vs %d",
			benchkit.RatioX(async.FirstWrite.P50, sync.FirstWrite.P50), benchkit.RatioX(async.P99BeforeMS, sync.P99BeforeMS),
			benchkit.RatioX(async.WritesPerSec, sync.WritesPerSec), async.Lost, sync.Lost)
	}
}
