package supervisor

import (
	"context"
	"sync"
	"time"
)

// The sampler looks at every started worker's process from /proc, off the
// loop, and posts what the machine acts on: a change of its process state
// between running and stopped (liveness.go), every stateEvery.
var stateEvery = time.Second

// sampled is what the sampler needs of a worker, registered by the loop
// when the worker starts and removed when it is reaped.
type sampled struct {
	pid int
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
	stopped := map[*worker]bool{} // as last posted
	t := time.NewTicker(stateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ws := s.sampled.list()
		for w := range stopped {
			if _, ok := ws[w]; !ok {
				delete(stopped, w)
			}
		}
		for w, x := range ws {
			st := procStateOf(x.pid)
			if st == 0 || isStopped(st) == stopped[w] {
				continue
			}
			stopped[w] = isStopped(st)
			select {
			case s.events <- evProcState{w: w, state: st}:
			case <-ctx.Done():
				return
			}
		}
	}
}
