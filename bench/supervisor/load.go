package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
)

type change struct {
	at  time.Duration // since the load started, taken just before the change
	ver int
}

// measure runs steady state, spaced reloads and the storm against url.
// apply(n) makes change n: afterwards new code answers with version n.
func measure(name, how, url string, apply func(n int) error) scenario {
	waitTimeWait()
	sc := scenario{Name: name, Reload: how, LoadBefore: benchkit.LoadAvg(3)}
	fmt.Printf("== %s (%s); load average %s\n", name, how, sc.LoadBefore)
	for _, s := range load(url, func(time.Time, *loader) { time.Sleep(*steadyFor) }) {
		if s.ok() {
			sc.SteadyRPS++
		}
	}
	sc.SteadyRPS /= steadyFor.Seconds()

	n := 0
	// next makes change n+1 and waits until the one after is due.
	next := func(start time.Time, every time.Duration) change {
		at := time.Now()
		n++
		if err := apply(n); err != nil {
			fmt.Fprintln(os.Stderr, "reload:", err)
		}
		time.Sleep(time.Until(at.Add(every)))
		return change{at.Sub(start), n}
	}
	var changes []change
	rec := load(url, func(start time.Time, _ *loader) {
		time.Sleep(500 * time.Millisecond)
		for range *reloads {
			changes = append(changes, next(start, *spacing))
		}
	})
	sc.Reloads = summarize(rec)
	sc.Reloads.toNewCode(rec, changes)

	var last change
	firstStorm := n + 1
	var stormStart, stormEnd time.Duration
	rec = load(url, func(start time.Time, l *loader) {
		time.Sleep(500 * time.Millisecond)
		stormStart = time.Since(start)
		stop := time.Now().Add(*stormFor)
		for time.Now().Before(stop) {
			last = next(start, *stormEvery)
		}
		stormEnd = time.Since(start)
		// Keep the load on until the newest version alone has answered
		// for a second (or 30 s): new code is seen only in answers.
		for time.Since(start.Add(last.at)) < 30*time.Second {
			l.mu.Lock() // what has completed so far
			_, all, _, ok := toNew(l.samples, last.at, math.MaxInt64, last.ver)
			l.mu.Unlock()
			if ok && time.Since(start.Add(last.at+all)) > time.Second {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	s := summarize(rec)
	versions := map[int]bool{}
	for _, r := range rec {
		if d := r.done(); r.ok() && d >= stormStart && d < stormEnd {
			s.RPS++
		}
		if r.ok() && r.ver >= firstStorm {
			versions[r.ver] = true
		}
	}
	s.RPS /= (stormEnd - stormStart).Seconds()
	s.VersionsServed = len(versions)
	// Only the last change counts: earlier ones are overtaken.
	s.toNewCode(rec, []change{last})
	s.Changes = n - firstStorm + 1
	sc.Storm = s
	sc.LoadAfter = benchkit.LoadAvg(3)
	return sc
}

// toNew finds, among the answers completed in [from, to), the first one
// carrying version ver or newer, and the first such answer after which no
// answer carries an older version (or none: error pages have no version),
// as times since from. Connection errors are not answers and do not count.
func toNew(rec []sample, from, to time.Duration, ver int) (first, all time.Duration, okFirst, okAll bool) {
	lastOld := time.Duration(-1)
	for _, s := range rec {
		if d := s.done(); d >= from && d < to && s.code != 0 && s.ver < ver && d > lastOld {
			lastOld = d
		}
	}
	first, all = math.MaxInt64, math.MaxInt64
	for _, s := range rec {
		d := s.done()
		if d < from || d >= to || !s.ok() || s.ver < ver {
			continue
		}
		first = min(first, d)
		if d > lastOld {
			all = min(all, d)
		}
	}
	okFirst, okAll = first != math.MaxInt64, all != math.MaxInt64
	return first - from, all - from, okFirst, okAll
}

// toNewCode fills p's figures of the changes made during rec, each one's
// answers counted until the next change.
func (p *phase) toNewCode(rec []sample, changes []change) {
	var firsts, alls []time.Duration
	for i, c := range changes {
		end := time.Duration(math.MaxInt64)
		if i+1 < len(changes) {
			end = changes[i+1].at
		}
		first, all, okFirst, okAll := toNew(rec, c.at, end, c.ver)
		if okFirst {
			firsts = append(firsts, first)
		}
		if okAll {
			alls = append(alls, all)
		}
	}
	f, a := benchkit.OfDurations(firsts), benchkit.OfDurations(alls)
	p.Changes, p.FirstSeen, p.AllNew = len(changes), len(firsts), len(alls)
	p.FirstP50MS, p.FirstMaxMS, p.AllP50MS, p.AllMaxMS = f.P50, f.Max, a.P50, a.Max
}

type sample struct {
	at   time.Duration // when it was due, since the load started
	lat  time.Duration
	code int // 0: connection error
	ver  int // the code version that answered; -1: none
}

func (s sample) done() time.Duration { return s.at + s.lat }
func (s sample) ok() bool            { return s.code >= 200 && s.code < 300 }

// Keep-alive, as a load balancer would: Go's worker closes idle
// connections when it drains (the client retries a GET whose reused
// connection was closed before any answer, as HTTP allows), and gunicorn's
// sync workers close after every response anyway.
var httpClient = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

// waitTimeWait lets TIME_WAIT sockets left by the previous scenario drain
// (up to a minute): tens of thousands of them make connect() slow on
// loopback and would be charged to the next scenario.
func waitTimeWait() {
	for deadline := time.Now().Add(70 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		b, _ := os.ReadFile("/proc/net/sockstat") // unreadable: no match, no wait
		m := regexp.MustCompile(`tw (\d+)`).FindSubmatch(b)
		if m == nil {
			return
		}
		if n, _ := strconv.Atoi(string(m[1])); n < 5000 {
			return
		}
	}
}

type loader struct {
	mu      sync.Mutex
	samples []sample
}

// version reads versioned_app.py's X-App-Version header, or the Go
// worker's greeting ("vN from pid ...").
var goVersion = regexp.MustCompile(`^v(\d+) `)

func version(h http.Header, body []byte) int {
	if v, err := strconv.Atoi(h.Get("X-App-Version")); err == nil {
		return v
	}
	if m := goVersion.FindSubmatch(body); m != nil {
		v, _ := strconv.Atoi(string(m[1]))
		return v
	}
	return -1
}

// load offers a constant rate of requests until driver returns (open loop:
// a slow server does not slow the offered load, and latency is measured
// from the moment a request was due, so queueing behind a stall counts),
// then waits for the requests in flight.
func load(url string, driver func(start time.Time, l *loader)) []sample {
	start, l, st := time.Now(), &loader{}, benchkit.NewStopper()
	sem := make(chan struct{}, 1024)
	interval := time.Duration(float64(time.Second) / float64(*rate))
	st.Go(func() {
		for i := 0; ; i++ {
			due := start.Add(time.Duration(i) * interval)
			time.Sleep(time.Until(due))
			select { // stop first: the select below picks at random
			case <-st.C:
				return
			default:
			}
			select {
			case <-st.C:
				return
			case sem <- struct{}{}:
			}
			st.Go(func() {
				defer func() { <-sem }()
				code, ver := 0, -1
				resp, err := httpClient.Get(url)
				if err == nil {
					var body []byte
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil {
						code, ver = resp.StatusCode, version(resp.Header, body)
					}
				}
				s := sample{at: due.Sub(start), lat: time.Since(due), code: code, ver: ver}
				l.mu.Lock()
				l.samples = append(l.samples, s)
				l.mu.Unlock()
			})
		}
	})
	driver(start, l)
	st.Stop()
	return l.samples
}

func summarize(rec []sample) phase {
	p := phase{Sent: len(rec)}
	lat := make([]time.Duration, len(rec))
	for i, s := range rec {
		lat[i] = s.lat
		if s.code == 0 {
			p.ConnErr++
		} else if !s.ok() {
			p.Non2xx++
		}
	}
	p.Failed = p.Non2xx + p.ConnErr
	st := benchkit.OfDurations(lat)
	p.P50MS, p.P99MS, p.MaxMS = st.P50, st.P99, st.Max
	return p
}
