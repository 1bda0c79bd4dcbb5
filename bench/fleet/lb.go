package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/keystream"
)

// The load balancer does what an HAProxy in front of the fleet would
// (docs/fleet.md): requests go only to backends whose /healthz answers; a
// refused connection goes to the next backend (it was never received).
// Nothing else is retried.

type backend struct {
	s      *sup
	client *http.Client
	port   atomic.Int64 // its service port; 0: down
	downAt atomic.Int64 // last time it went from up to down, Unix ns (0: never)
}

type balancer struct {
	backends []*backend
	next     atomic.Uint64
	checks   *benchkit.Stopper
}

func newBalancer(sups []*sup) *balancer {
	lb := &balancer{checks: benchkit.NewStopper()}
	for _, s := range sups {
		tr := &http.Transport{DialContext: s.dial, MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}
		be := &backend{s: s, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
		lb.backends = append(lb.backends, be)
		lb.checks.Go(func() { be.checkLoop(lb.checks.C) })
	}
	return lb
}

func (lb *balancer) close() {
	lb.checks.Stop()
	for _, be := range lb.backends {
		be.client.CloseIdleConnections()
	}
}

// down names the backends that are down.
func (lb *balancer) down() (names []string) {
	for _, be := range lb.backends {
		if be.port.Load() == 0 {
			names = append(names, be.s.name)
		}
	}
	return names
}

// waitUp waits until every backend is up.
func (lb *balancer) waitUp(ctx context.Context, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); len(lb.down()) > 0; {
		if time.Now().After(deadline) {
			return fmt.Errorf("load balancer: backends not up after %s: %s", timeout, strings.Join(lb.down(), ", "))
		}
		if err := benchkit.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func (be *backend) set(port int) {
	if old := be.port.Swap(int64(port)); old > 0 && port == 0 {
		be.downAt.Store(time.Now().UnixNano())
	}
}

// checkLoop checks /healthz every 200 ms (1 s timeout): down after 3
// failed checks in a row (HAProxy's "fall 3": a slow answer on a busy host
// is not an outage), up after one good one.
func (be *backend) checkLoop(stop <-chan struct{}) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for fails := 0; ; {
		if be.s.healthy(time.Second) {
			fails = 0
			if be.port.Load() == 0 {
				be.set(be.s.servicePort())
			}
		} else if fails++; fails >= 3 || be.port.Load() == 0 {
			be.set(0) // a supervisor back in service binds a new port
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// pick returns an up backend, round robin, waiting up to 2 s for one (a
// balancer holds a request that briefly; then it answers 503).
func (lb *balancer) pick(skip *backend) (*backend, int) {
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := uint64(len(lb.backends))
		start := lb.next.Add(1)
		for i := range n {
			be := lb.backends[(start+i)%n]
			if be == skip && n > 1 {
				continue
			}
			if port := be.port.Load(); port > 0 {
				return be, int(port)
			}
		}
		if time.Now().After(deadline) {
			return nil, 0
		}
	}
}

// servicePort is the port the supervisor bound for its workers (the
// pool's 127.0.0.1:0), 0 if it has none now: the one of its socket inodes
// (/proc/PID/fd) among the LISTEN sockets of its network namespace
// (/proc/PID/net/tcp, tcp6) that is not its admin port.
func (s *sup) servicePort() int {
	dir := "/proc/" + strconv.Itoa(s.p.pid())
	ents, _ := os.ReadDir(dir + "/fd")
	inodes := map[string]bool{}
	for _, e := range ents {
		l, err := os.Readlink(dir + "/fd/" + e.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	for _, f := range []string{"/net/tcp", "/net/tcp6"} {
		data, _ := os.ReadFile(dir + f)
		for line := range strings.Lines(string(data)) {
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode (the
			// header's fourth field is "rem_address", never "0A")
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "0A" || !inodes[fs[9]] {
				continue
			}
			_, hex, _ := strings.Cut(fs[1], ":")
			if p, err := strconv.ParseUint(hex, 16, 16); err == nil && !strings.HasSuffix(s.admin, ":"+strconv.Itoa(int(p))) {
				return int(p)
			}
		}
	}
	return 0
}

type noteKey struct {
	uid string
	id  int64
}

// entry is a note's last acknowledged state, and what failed writes after
// it may have left instead (the client cannot know whether they landed).
type entry struct {
	body      string
	deleted   bool
	maybeBody []string // bodies of failed updates since the last ack
	maybeGone bool     // a delete failed since the last ack
}

// reqRec is one request as the client saw it.
type reqRec struct {
	at, dur time.Duration // since the load started
	backend string        // its supervisor, "": none was up
	write   bool
	err     error // nil when it succeeded
}

// loadRun is a load until Stop (which waits for the requests in flight).
type loadRun struct {
	*benchkit.Stopper
	name     string
	lb       *balancer
	started  time.Time
	mu       sync.Mutex
	recs     []reqRec
	book     map[noteKey]entry
	stale    int          // lists that missed acknowledged notes (or held deleted ones)
	staleEx  []string     // the first few
	idle     atomic.Int64 // requests resent by net/http on a closed keep-alive connection
	rerouted atomic.Int64 // requests sent to another backend after a refused connection
}

func startLoad(name string, lb *balancer) *loadRun {
	l := &loadRun{Stopper: benchkit.NewStopper(), name: name, lb: lb, started: time.Now(), book: map[noteKey]entry{}}
	per := float64(*clients) / float64(*rate) // seconds between one client's requests
	for g := range *clients {
		l.Go(func() { l.client(g, time.Duration(per*float64(time.Second))) })
	}
	return l
}

func (l *loadRun) client(g int, every time.Duration) {
	rng := rand.New(rand.NewPCG(uint64(g), uint64(l.started.UnixNano())))
	var mine []string
	for u := g; u < *users; u += *clients {
		mine = append(mine, fmt.Sprintf("%s-%05d", l.name, u))
	}
	if len(mine) == 0 {
		return
	}
	notes := map[string][]int64{}
	unsure := map[string]bool{} // a create failed: the list may hold a note we do not know
	t := time.NewTicker(every)
	defer t.Stop()
	// Spread the clients' ticks over the first interval.
	time.Sleep(time.Duration(rng.Int64N(int64(every) + 1)))
	for {
		select {
		case <-l.C:
			return
		case <-t.C:
		}
		uid := mine[rng.IntN(len(mine))]
		ids := notes[uid]
		op := rng.IntN(10)
		switch {
		case op < 4 || len(ids) == 0: // create
			body := fmt.Sprintf("note %d of %s", rng.Int64(), uid)
			var n struct {
				ID int64 `json:"id"`
			}
			if err := l.call("POST", "/v1/users/"+uid+"/notes", body, http.StatusCreated, &n); err == nil {
				notes[uid] = append(ids, n.ID)
				l.ack(noteKey{uid, n.ID}, nil, body)
			} else {
				unsure[uid] = true
			}
		case op == 7 || op == 8: // list
			var got []struct {
				ID   int64  `json:"id"`
				Node string `json:"node"`
			}
			t0 := time.Since(l.started)
			err := l.call("GET", "/v1/users/"+uid+"/notes", "", http.StatusOK, &got)
			if err == nil && len(got) != len(ids) && !unsure[uid] {
				node := "no note to say"
				if len(got) > 0 {
					node = got[0].Node
				}
				// Answered, so not a failure, but a stale read (reads are not
				// fenced, docs/data-contract.md), counted and shown on its own.
				l.mu.Lock()
				if l.stale++; len(l.staleEx) < 5 {
					l.staleEx = append(l.staleEx, fmt.Sprintf("at %.3f s: list of %s returned %d notes, %d acknowledged, served from %s", t0.Seconds(), uid, len(got), len(ids), node))
				}
				l.mu.Unlock()
			}
		default: // update (4-6) or delete (9)
			i := rng.IntN(len(ids))
			method, body, want := http.MethodDelete, "", http.StatusNoContent
			if op < 7 {
				method, body, want = http.MethodPut, fmt.Sprintf("edit %d of %s", rng.Int64(), uid), http.StatusOK
			}
			err := l.call(method, fmt.Sprintf("/v1/users/%s/notes/%d", uid, ids[i]), body, want, nil)
			l.ack(noteKey{uid, ids[i]}, err, body)
			if err == nil && body == "" {
				notes[uid] = slices.Delete(ids, i, i+1)
			}
		}
	}
}

// ack records a write on note k in the book (body "": a delete): when it
// succeeded, the note's state; when it failed, what it may have left.
func (l *loadRun) ack(k noteKey, err error, body string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.book[k]
	switch {
	case err == nil:
		e = entry{body: body, deleted: body == ""}
	case body == "":
		e.maybeGone = true
	default:
		e.maybeBody = append(e.maybeBody, body)
	}
	l.book[k] = e
}

// call sends one request through the balancer and records it. Writes
// carry an Idempotency-Key, which makes net/http resend them on a reused
// connection the server closed before answering (as examples/notes/loadgen
// does; see docs/supervisor.md): counted in idle, not failures.
func (l *loadRun) call(method, path, body string, want int, out any) (err error) {
	t0 := time.Now()
	rec := reqRec{at: t0.Sub(l.started), write: method != http.MethodGet}
	defer func() {
		rec.dur, rec.err = time.Since(t0), err
		l.mu.Lock()
		defer l.mu.Unlock()
		l.recs = append(l.recs, rec)
	}()
	hdr := http.Header{}
	if rec.write {
		hdr.Set("Idempotency-Key", benchkit.IdempotencyKey())
	}
	var b []byte
	if body != "" {
		b, _ = json.Marshal(map[string]string{"body": body})
	}
	var last *backend
	for attempt := 0; ; attempt++ {
		be, port := l.lb.pick(last)
		if be == nil {
			return errors.New("no backend up")
		}
		rec.backend = be.s.name
		conns := 0
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { conns++ }})
		req, err := http.NewRequestWithContext(ctx, method, "http://127.0.0.1:"+strconv.Itoa(port)+path, bytes.NewReader(b))
		if err != nil {
			return err
		}
		req.Header = hdr
		res, err := be.client.Do(req)
		l.idle.Add(int64(max(conns-1, 0)))
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) && attempt < 3 {
				// Never received: the balancer tries the next backend.
				be.set(0)
				l.rerouted.Add(1)
				last = be
				continue
			}
			return err
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if method == http.MethodDelete && conns > 1 && res.StatusCode == http.StatusNotFound {
			return nil // the first try deleted it; the resend found nothing
		}
		if res.StatusCode != want {
			return fmt.Errorf("status %d: %s", res.StatusCode, bytes.TrimSpace(data))
		}
		if out != nil {
			return json.Unmarshal(data, out)
		}
		return nil
	}
}

// loadStats summarises the requests of a load run from an instant (an
// offset from its start) on.
type loadStats struct {
	Requests  int            `json:"requests"`
	Failed    int            `json:"failed"`
	FailedOn  map[string]int `json:"failed_by_backend,omitempty"`
	Errors    map[string]int `json:"errors,omitempty"`
	LastError string         `json:"last_error,omitempty"`
	Writes    benchkit.Stat  `json:"write_latency_ms"`
	Rerouted  int64          `json:"rerouted"`
	Resent    int64          `json:"resent_on_closed_keepalive"`
	Stale     int            `json:"stale_lists"`
	StaleEx   []string       `json:"stale_list_examples,omitempty"`
	Seconds   float64        `json:"seconds"`
}

func (l *loadRun) stats(from time.Duration) loadStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := loadStats{FailedOn: map[string]int{}, Errors: map[string]int{}, Rerouted: l.rerouted.Load(), Resent: l.idle.Load(), Stale: l.stale, StaleEx: l.staleEx}
	var lat []float64
	var last time.Duration
	for _, r := range l.recs {
		if r.at < from {
			continue
		}
		last = max(last, r.at+r.dur)
		st.Requests++
		if r.err == nil {
			if r.write {
				lat = append(lat, benchkit.MS(r.dur))
			}
			continue
		}
		st.Failed++
		st.FailedOn[cmp.Or(r.backend, "balancer")]++
		st.LastError = r.err.Error()
		st.Errors[errKind(st.LastError)]++
	}
	st.Writes, st.Seconds = benchkit.Of(lat), (last - from).Seconds()
	return st
}

// errKind shortens an error to its class for the error histogram.
func errKind(s string) string {
	switch {
	case strings.HasPrefix(s, "status "):
		return s[:len("status 503")]
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "connection reset"):
		return "connection reset"
	case strings.Contains(s, "EOF"):
		return "EOF"
	case strings.Contains(s, "Timeout") || strings.Contains(s, "deadline"):
		return "timeout"
	}
	return s[:min(len(s), 60)]
}

// verification is what the db nodes hold of the acknowledged writes.
type verification struct {
	Checked   int      `json:"checked"`
	Missing   int      `json:"missing"`     // an acknowledged note is not on its owner
	Wrong     int      `json:"wrong_body"`  // its body is neither the acknowledged one nor a later attempt's
	Resurrect int      `json:"resurrected"` // an acknowledged delete did not stick
	Unsure    int      `json:"unsure"`      // differs, but as a failed later write may have left it: not lost
	Examples  []string `json:"examples,omitempty"`
}

func (v verification) lost() int { return v.Missing + v.Wrong + v.Resurrect }

// verify checks every acknowledged write of l on its owner in the current
// map, as examples/notes/loadgen verify does.
func (c *cluster) verify(ctx context.Context, l *loadRun) (verification, error) {
	var v verification
	m, _, err := c.st.Load(ctx)
	if err != nil {
		return v, err
	}
	conns := map[bucketmap.NodeID]*pgx.Conn{}
	for _, n := range m.Nodes() {
		if n.State == bucketmap.NodeRemoved || n.State == bucketmap.NodeDown {
			continue
		}
		conn, err := dbnode.Connect(ctx, n)
		if err != nil {
			return v, err
		}
		defer conn.Close(context.Background())
		conns[n.ID] = conn
	}
	bad := func(format string, args ...any) {
		if len(v.Examples) < 5 {
			v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, e := range l.book {
		if e.body == "" && !e.deleted {
			continue // only failed writes: nothing acknowledged
		}
		v.Checked++
		p := c.ks.Prefix64(k.uid)
		owner := m.OwnerOf(m.BucketOf(c.ks, k.uid))
		var body string
		err := conns[owner].QueryRow(ctx, "SELECT body FROM app.notes WHERE bkey = $1 AND uid = $2 AND id = $3",
			keystream.Key(p), k.uid, k.id).Scan(&body)
		switch {
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return v, err
		case e.deleted && err == nil:
			v.Resurrect++
			bad("%s note %d was deleted but is on %s", k.uid, k.id, owner)
		case e.deleted:
		case errors.Is(err, pgx.ErrNoRows) && e.maybeGone:
			v.Unsure++
		case errors.Is(err, pgx.ErrNoRows):
			v.Missing++
			bad("%s note %d is not on its owner %s", k.uid, k.id, owner)
		case body == e.body:
		case slices.Contains(e.maybeBody, body):
			v.Unsure++
		default:
			v.Wrong++
			bad("%s note %d on %s has %q, acknowledged %q", k.uid, k.id, owner, body, e.body)
		}
	}
	return v, nil
}
