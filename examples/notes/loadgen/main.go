// Command loadgen puts a constant load of many users on the notes app and
// keeps a ledger of every acknowledged write, then checks the ledger
// against the db nodes.
//
//	loadgen run    --url http://127.0.0.1:8080 --users 200 --concurrency 16 --ledger L --summary S
//	loadgen verify --ledger L [--others]       (reads the live map from ZooKeeper; over TLS with -zk-tls-* or SHARDVISOR_ZK_TLS_*)
//
// run stops on SIGINT/SIGTERM (or after --duration), waits for requests in
// flight, and writes the ledger (the last acknowledged state of every note)
// and a JSON summary. verify checks that every acknowledged note is on the
// node that owns its user in the current map, with its last acknowledged
// body, that acknowledged deletes stuck, and with --others that no other
// node still holds the user's rows (after GC).
package main

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/signal"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen run|verify [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "verify":
		err = verify(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "loadgen: unknown command %q (run or verify)\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// Entry is a note's last acknowledged state. A write that got no answer
// (the connection died: a host left service, a worker was killed) may or
// may not have committed, so it makes its outcome one of two acceptable
// states: MaybeDeleted (a DELETE), or MaybeBody (a PUT's new body). The
// next acknowledged write settles it again.
type Entry struct {
	UID          string `json:"uid"`
	ID           int64  `json:"id"`
	Body         string `json:"body"`
	Deleted      bool   `json:"deleted,omitempty"`
	MaybeDeleted bool   `json:"maybe_deleted,omitempty"`
	MaybeBody    string `json:"maybe_body,omitempty"`
}

// Summary is what a run did.
type Summary struct {
	Requests  int64            `json:"requests"`
	OK        int64            `json:"ok"`
	Failed    int64            `json:"failed"`
	Writes    int64            `json:"acknowledged_writes"`
	Seconds   float64          `json:"seconds"`
	P50MS     float64          `json:"p50_ms"`
	P99MS     float64          `json:"p99_ms"`
	MaxMS     float64          `json:"max_ms"`
	Errors    map[string]int64 `json:"errors,omitempty"`
	LastError string           `json:"last_error,omitempty"`
	// IdleRetries counts requests resent because the server closed a
	// keep-alive connection before answering (see call). They are not
	// failures: every write is idempotent by its Idempotency-Key.
	IdleRetries int64 `json:"idle_close_retries"`
	// Resent counts writes resent with their Idempotency-Key after an
	// answer that left the outcome unknown (the app's 502, or none).
	Resent int64 `json:"unknown_outcome_resends"`
}

type stats struct {
	requests, ok, failed, writes atomic.Int64
	idleRetries                  atomic.Int64
	resent                       atomic.Int64 // writes resent after an unknown outcome
	mu                           sync.Mutex
	lat                          []float64
	errs                         map[string]int64
	last                         string
	// failures, when set, gets a JSON line per failed request (when it
	// started and ended, and why), so that a run can tell failures in a
	// fault's window from the others.
	failures *json.Encoder
}

// Failure is one failed request, as --failures writes it.
type Failure struct {
	Start float64 `json:"start"` // Unix time, seconds
	End   float64 `json:"end"`
	Error string  `json:"error"`
}

func (s *stats) record(d time.Duration, err error) {
	s.requests.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lat = append(s.lat, float64(d.Microseconds())/1000)
	if err != nil {
		s.failed.Add(1)
		s.errs[kind(err)]++
		s.last = err.Error()
		if s.failures != nil {
			now := time.Now()
			unix := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
			_ = s.failures.Encode(Failure{Start: unix(now.Add(-d)), End: unix(now), Error: err.Error()})
		}
		return
	}
	s.ok.Add(1)
}

func kind(err error) string {
	var he *httpError
	if errors.As(err, &he) {
		return fmt.Sprintf("http %d", he.code)
	}
	return "connection"
}

type httpError struct {
	code int
	body string
}

func (e *httpError) Error() string { return fmt.Sprintf("status %d: %s", e.code, e.body) }

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "notes app base URL")
	users := fs.Int("users", 200, "number of users")
	conc := fs.Int("concurrency", 16, "concurrent clients (each owns users/concurrency users)")
	dur := fs.Duration("duration", 0, "stop after this long (0: on SIGINT/SIGTERM)")
	ledger := fs.String("ledger", "ledger.jsonl", "where to write the ledger")
	summary := fs.String("summary", "", "where to write the JSON summary (default: stdout)")
	every := fs.Duration("status-every", time.Second, "print a status line this often (0: never)")
	prefix := fs.String("prefix", "user", "user id prefix")
	failures := fs.String("failures", "", "append a JSON line per failed request (start, end, error) to this file")
	rate := fs.Float64("rate", 0, "at most this many requests/s in all, spread evenly over time (0: each client as fast as it goes)")
	fs.Parse(args)
	if *rate < 0 {
		return fmt.Errorf("--rate %v: must be 0 (no limit) or more", *rate)
	}
	pace := newPacer(*rate)
	if *users < *conc {
		*conc = *users
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *dur > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *dur)
		defer cancel()
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *conc * 2}}
	st := &stats{errs: map[string]int64{}}
	if *failures != "" {
		f, err := os.OpenFile(*failures, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		st.failures = json.NewEncoder(f)
	}
	var (
		mu   sync.Mutex
		book = map[[2]any]Entry{}
		wg   sync.WaitGroup
	)
	start := time.Now()
	for g := range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(start.UnixNano())))
			var mine []string
			for u := g; u < *users; u += *conc {
				mine = append(mine, fmt.Sprintf("%s-%05d", *prefix, u))
			}
			notes := map[string][]int64{}
			for ctx.Err() == nil {
				if !pace.wait(ctx) {
					break
				}
				uid := mine[rng.IntN(len(mine))]
				ids := notes[uid]
				op := rng.IntN(10)
				t := time.Now()
				var err error
				switch {
				case op < 4 || len(ids) == 0: // create
					body := fmt.Sprintf("note %d of %s", rng.Int64(), uid)
					var n struct {
						ID int64 `json:"id"`
					}
					if err = st.call(client, "POST", *url+"/v1/users/"+uid+"/notes", body, http.StatusCreated, &n); err == nil {
						notes[uid] = append(ids, n.ID)
						mu.Lock()
						book[[2]any{uid, n.ID}] = Entry{UID: uid, ID: n.ID, Body: body}
						mu.Unlock()
						st.writes.Add(1)
					}
				case op < 7: // update
					id := ids[rng.IntN(len(ids))]
					body := fmt.Sprintf("edit %d of %s", rng.Int64(), uid)
					if err = st.call(client, "PUT", fmt.Sprintf("%s/v1/users/%s/notes/%d", *url, uid, id), body, http.StatusOK, nil); err == nil {
						mu.Lock()
						book[[2]any{uid, id}] = Entry{UID: uid, ID: id, Body: body}
						mu.Unlock()
						st.writes.Add(1)
					} else if unanswered(err) {
						mu.Lock()
						e := book[[2]any{uid, id}]
						e.MaybeBody = body
						book[[2]any{uid, id}] = e
						mu.Unlock()
					}
				case op < 9: // list
					var got []struct {
						ID int64 `json:"id"`
					}
					if err = st.call(client, "GET", *url+"/v1/users/"+uid+"/notes", "", http.StatusOK, &got); err == nil && len(got) != len(ids) {
						err = fmt.Errorf("list of %s returned %d notes, %d acknowledged", uid, len(got), len(ids))
					}
				default: // delete
					i := rng.IntN(len(ids))
					id := ids[i]
					if err = st.call(client, "DELETE", fmt.Sprintf("%s/v1/users/%s/notes/%d", *url, uid, id), "", http.StatusNoContent, nil); err == nil {
						notes[uid] = slices.Delete(ids, i, i+1)
						mu.Lock()
						book[[2]any{uid, id}] = Entry{UID: uid, ID: id, Deleted: true}
						mu.Unlock()
						st.writes.Add(1)
					} else if unanswered(err) {
						// Never touched again by this run: its fate is
						// whichever the server chose.
						notes[uid] = slices.Delete(ids, i, i+1)
						mu.Lock()
						e := book[[2]any{uid, id}]
						e.MaybeDeleted = true
						book[[2]any{uid, id}] = e
						mu.Unlock()
					}
				}
				if ctx.Err() != nil && err != nil {
					break // cut short by the stop, not a failure of the app
				}
				st.record(time.Since(t), err)
			}
		}()
	}
	if *every > 0 {
		go func() {
			t := time.NewTicker(*every)
			defer t.Stop()
			var prev int64
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					n := st.requests.Load()
					fmt.Fprintf(os.Stderr, "loadgen: %6d req/s, %d requests, %d failed, %d writes acknowledged\n", int64(float64(n-prev)/every.Seconds()), n, st.failed.Load(), st.writes.Load())
					prev = n
				}
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	sum := Summary{Requests: st.requests.Load(), OK: st.ok.Load(), Failed: st.failed.Load(), Writes: st.writes.Load(),
		Seconds: time.Since(start).Seconds(), Errors: st.errs, LastError: st.last, IdleRetries: st.idleRetries.Load(), Resent: st.resent.Load()}
	sort.Float64s(st.lat)
	if n := len(st.lat); n > 0 {
		sum.P50MS, sum.P99MS, sum.MaxMS = st.lat[n/2], st.lat[min(n-1, n*99/100)], st.lat[n-1]
	}
	f, err := os.Create(*ledger)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, e := range book {
		enc.Encode(e)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	f.Close()
	out := os.Stdout
	if *summary != "" {
		if out, err = os.Create(*summary); err != nil {
			return err
		}
		defer out.Close()
	}
	return json.NewEncoder(out).Encode(sum)
}

// call sends one request. Every write carries an Idempotency-Key: the
// notes app applies a write with a key it has seen once only (a create
// with a known key returns the note it made; a PUT of the same body
// changes nothing; a DELETE that already happened finds nothing). That
// makes them safe to resend, and net/http resends a request on a reused
// keep-alive connection that the server closed before answering, which a
// draining worker does to its idle connections: HTTP/1.1 cannot warn a
// client first (RFC 9112 section 9.3.1), and without a key net/http resends
// only GET, HEAD, OPTIONS and TRACE. call counts the resends. Any other
// error, a fresh connection closed without an answer included, stays a
// failure.
func (s *stats) call(c *http.Client, method, url, body string, want int, out any) error {
	key := ""
	if method != http.MethodGet {
		key = idempotencyKey()
	}
	// A write whose outcome is unknown (no answer, or the app's 502: its
	// db connection died after the statement was sent) is resent with
	// the same key until it gets an answer, as a careful client does: the
	// resend finds the note made, the body set or the note gone.
	// Once the outcome is unknown only a real answer settles it: a 503 to
	// a resend (the db node has no primary yet) says nothing about the
	// first try, so the resends go on.
	deadline := time.Now().Add(resendFor)
	unknown := false
	for attempt := 0; ; attempt++ {
		err := s.call1(c, method, url, body, key, want, out, attempt > 0)
		if err == nil || key == "" {
			return err
		}
		if unanswered(err) {
			unknown = true
		}
		if !unknown {
			return err
		}
		if time.Now().After(deadline) {
			return &unknownOutcome{err}
		}
		s.resent.Add(1)
		time.Sleep(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second))
	}
}

// unknownOutcome: resends ran out without an answer that settles whether
// the write happened.
type unknownOutcome struct{ last error }

func (e *unknownOutcome) Error() string { return "outcome unknown after resends: " + e.last.Error() }

// resendFor bounds how long call resends a write whose outcome is unknown:
// longer than a db node's failover (Patroni's ttl, then the promotion).
var resendFor = 60 * time.Second

func (s *stats) call1(c *http.Client, method, url, body, key string, want int, out any, resend bool) error {
	var b []byte
	if body != "" {
		b, _ = json.Marshal(map[string]string{"body": body})
	}
	conns := 0
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { conns++ }})
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := c.Do(req)
	if conns > 1 {
		s.idleRetries.Add(int64(conns - 1))
	}
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if method == http.MethodDelete && (conns > 1 || resend) && res.StatusCode == http.StatusNotFound {
		return nil // the first try deleted it; the resend found nothing
	}
	if res.StatusCode != want {
		return &httpError{res.StatusCode, string(bytes.TrimSpace(data))}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

func idempotencyKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Verification is what verify found.
type Verification struct {
	Checked     int `json:"checked"`
	Missing     int `json:"missing"`
	Wrong       int `json:"wrong_body"`
	Resurrected int `json:"deleted_but_present"`
	// Unanswered: notes whose last write got no answer and did commit
	// (allowed: the client cannot know).
	Unanswered   int      `json:"unanswered_writes_committed"`
	OnOtherNodes int      `json:"rows_on_other_nodes"`
	Examples     []string `json:"examples,omitempty"`
}

func verify(args []string) error {
	fs := flag.NewFlagSet("verify", flag.ExitOnError)
	ledger := fs.String("ledger", "ledger.jsonl", "the ledger written by run")
	zkc := fs.String("zk", envOr("SHARDVISOR_ZK", "127.0.0.1:21811,127.0.0.1:21812,127.0.0.1:21813"), "ZooKeeper connect string")
	root := fs.String("zk-root", os.Getenv("SHARDVISOR_ZK_ROOT"), "ZooKeeper root")
	cluster := fs.String("cluster", envOr("SHARDVISOR_CLUSTER", "default"), "cluster")
	others := fs.Bool("others", false, "also check that no other node holds the users' rows (after GC)")
	// ZooKeeper over TLS, as shardvisor's binaries dial it (make demo's default).
	tlsCA := fs.String("zk-tls-ca", os.Getenv("SHARDVISOR_ZK_TLS_CA"), "PEM file of the ZooKeeper servers' CA; with -zk-tls-cert and -zk-tls-key ZooKeeper is dialled over TLS")
	tlsCert := fs.String("zk-tls-cert", os.Getenv("SHARDVISOR_ZK_TLS_CERT"), "PEM file of this client's certificate for ZooKeeper")
	tlsKey := fs.String("zk-tls-key", os.Getenv("SHARDVISOR_ZK_TLS_KEY"), "PEM file of the key of -zk-tls-cert")
	fs.Parse(args)
	zcfg := zksession.Config{Connect: *zkc}
	if err := zcfg.UseTLS(*tlsCA, *tlsCert, *tlsKey); err != nil {
		return err
	}
	var entries []Entry
	f, err := os.Open(*ledger)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(f)
	for {
		var e Entry
		if err := dec.Decode(&e); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", *ledger, err)
		}
		entries = append(entries, e)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := zksession.Open(zcfg)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.WaitConnected(ctx); err != nil {
		return err
	}
	p, err := topo.NewPaths(*root, *cluster)
	if err != nil {
		return err
	}
	crec, err := topo.ReadCluster(ctx, s, p)
	if err != nil {
		return err
	}
	m, _, err := bucketmap.NewStore(s, p).Load(ctx)
	if err != nil {
		return err
	}
	seed, _ := keystream.ParseSeed(crec.Seed)
	ks, _ := keystream.New(seed)
	conns := map[bucketmap.NodeID]*pgx.Conn{}
	for _, n := range m.Nodes() {
		if n.State == bucketmap.NodeRemoved || n.State == bucketmap.NodeDown {
			continue
		}
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		conns[n.ID] = c
	}
	v := Verification{}
	bad := func(format string, args ...any) {
		if len(v.Examples) < 10 {
			v.Examples = append(v.Examples, fmt.Sprintf(format, args...))
		}
	}
	users := map[string]bool{}
	for _, e := range entries {
		v.Checked++
		users[e.UID] = true
		key := keystream.Key(ks.Prefix64(e.UID))
		owner := m.OwnerOf(m.BucketOf(ks, e.UID))
		c := conns[owner]
		var body string
		err := c.QueryRow(ctx, "SELECT body FROM app.notes WHERE bkey = $1 AND uid = $2 AND id = $3", key, e.UID, e.ID).Scan(&body)
		switch {
		case e.Deleted && err == nil:
			v.Resurrected++
			bad("%s note %d was deleted but is on %s", e.UID, e.ID, owner)
		case e.Deleted && errors.Is(err, pgx.ErrNoRows):
		case e.MaybeDeleted && errors.Is(err, pgx.ErrNoRows):
			v.Unanswered++
		case errors.Is(err, pgx.ErrNoRows):
			v.Missing++
			bad("%s note %d is not on its owner %s", e.UID, e.ID, owner)
		case err != nil:
			return err
		case body != e.Body && e.MaybeBody != "" && body == e.MaybeBody:
			v.Unanswered++
		case body != e.Body:
			v.Wrong++
			bad("%s note %d on %s has %q, acknowledged %q", e.UID, e.ID, owner, body, e.Body)
		}
	}
	if *others {
		for uid := range users {
			key := keystream.Key(ks.Prefix64(uid))
			owner := m.OwnerOf(m.BucketOf(ks, uid))
			for id, c := range conns {
				if id == owner {
					continue
				}
				var n int
				if err := c.QueryRow(ctx, "SELECT count(*) FROM app.notes WHERE bkey = $1 AND uid = $2", key, uid).Scan(&n); err != nil {
					return err
				}
				if n > 0 {
					v.OnOtherNodes += n
					bad("%d rows of %s are still on %s, which does not own it", n, uid, id)
				}
			}
		}
	}
	json.NewEncoder(os.Stdout).Encode(v)
	if v.Missing+v.Wrong+v.Resurrected+v.OnOtherNodes > 0 {
		return fmt.Errorf("verification failed: %d missing, %d wrong, %d resurrected, %d on other nodes", v.Missing, v.Wrong, v.Resurrected, v.OnOtherNodes)
	}
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// unanswered reports whether a write's request may have reached the app
// without its answer reaching us: the outcome is unknown. An HTTP error
// status is an answer.
// unanswered: the request got no answer, or the app's 502 (its db
// connection died after the statement was sent): the write may or may not
// have happened.
func unanswered(err error) bool {
	var se *httpError
	var uo *unknownOutcome
	return err != nil && (errors.As(err, &uo) || !errors.As(err, &se) || se.code == http.StatusBadGateway)
}
