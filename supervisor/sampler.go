package supervisor

import (
	"context"
	"os"
	"sync"
	"time"
)

// The sampler looks at every started worker's process from /proc, off the
// loop, and posts what the machine acts on: a change of its process state
// between running and stopped (liveness.go), every stateEvery; and, for
// pools with max_memory, the resident memory of its process tree
// (recycle.go), every memEvery.
var (
	stateEvery = time.Second
	memEvery   = 2 * time.Second
)

// sampled is what the sampler needs of a worker, registered by the loop
// when the worker starts and removed when it is reaped.
type sampled struct {
	pid int
	mem bool // measure its memory: its pool has max_memory
}

// sampleSet is the loop's list of workers for the sampler.
type sampleSet struct {
	mu sync.Mutex
	ws map[*worker]sampled
}

func (s *sampleSet) add(w *worker, x sampled) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ws == nil {
		s.ws = map[*worker]sampled{}
	}
	s.ws[w] = x
}

func (s *sampleSet) remove(w *worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ws, w)
}

func (s *sampleSet) list() map[*worker]sampled {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[*worker]sampled, len(s.ws))
	for w, x := range s.ws {
		out[w] = x
	}
	return out
}

// procStateOf is pid's state letter, 0 when /proc cannot say (it exited).
func procStateOf(pid int) byte {
	p, err := readProcStat(pid)
	if err != nil {
		return 0
	}
	return p.state
}

// runSampler samples until ctx ends.
func (s *Supervisor) runSampler(ctx context.Context) {
	// The state as last posted: a flip between running and stopped, and
	// between the stopped states ('T' then 't': SIGSTOPped, then a
	// debugger attached), which the machine treats apart.
	posted := map[*worker]byte{}
	var memAt time.Time
	t := time.NewTicker(min(stateEvery, memEvery))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ws := s.sampled.list()
		for w := range posted {
			if _, ok := ws[w]; !ok {
				delete(posted, w)
			}
		}
		if now := time.Now(); !now.Before(memAt) {
			memAt = now.Add(memEvery)
			for _, ev := range measureMemory(ws) {
				select {
				case s.events <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
		for w, x := range ws {
			st := procStateOf(x.pid)
			was := posted[w]
			if st == 0 || (isStopped(st) == isStopped(was) && (!isStopped(st) || st == was)) {
				continue
			}
			posted[w] = st
			select {
			case s.events <- evProcState{w: w, state: st}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// measureMemory is the resident memory of the tree of every worker in ws
// that wants it: its main process and all its descendants, from one read
// of /proc. Shared pages (a pre-forking server's copy-on-write memory)
// count in every process that maps them, as in ps and top.
func measureMemory(ws map[*worker]sampled) []evMemory {
	want := false
	for _, x := range ws {
		want = want || x.mem
	}
	if !want {
		return nil
	}
	procs, err := readProcs()
	if err != nil {
		return nil
	}
	page := int64(os.Getpagesize())
	var out []evMemory
	for w, x := range ws {
		if !x.mem {
			continue
		}
		var rss int64
		found := false
		for _, p := range procs {
			if p.pid == x.pid {
				rss, found = p.rss, true
			}
		}
		if !found {
			continue // exiting
		}
		for _, p := range descendants(x.pid, procs) {
			rss += p.rss
		}
		out = append(out, evMemory{w: w, rss: rss * page})
	}
	return out
}
