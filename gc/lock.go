package gc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// ErrLocked means another process holds the GC lock.
var ErrLocked = errors.New("another GC holds the lock")

// Lock is the cluster's GC lock: the ephemeral node locks/gc/holder, so at
// most one GC runs at a time and a crashed holder's lock goes away with its
// session.
type Lock struct {
	e    *zksession.Ephemeral
	sub  *zksession.Subscription
	lost chan struct{}
	done chan struct{}
}

// Holder is the lock node's content, for people.
type Holder struct {
	Host  string    `json:"host"`
	PID   int       `json:"pid"`
	Since time.Time `json:"since"`
}

// LockPath is where the lock lives.
func LockPath(p topo.Paths) string { return path.Join(p.Lock("gc"), "holder") }

// Acquire takes the GC lock or fails at once with ErrLocked naming the
// holder. Lost is closed if the session is lost while it is held (the
// server may then give the lock to another process): stop at once.
func Acquire(ctx context.Context, s *zksession.Session, p topo.Paths) (*Lock, error) {
	host, _ := os.Hostname()
	data, _ := json.Marshal(Holder{Host: host, PID: os.Getpid(), Since: time.Now().UTC()})
	sub := s.Subscribe()
	e, err := s.CreateEphemeral(ctx, LockPath(p), data, nil)
	if err != nil {
		sub.Close()
		if strings.Contains(err.Error(), "already registered by this process") {
			return nil, fmt.Errorf("%w (this process, at %s)", ErrLocked, LockPath(p))
		}
		if errors.Is(err, zksession.ErrOwnedElsewhere) {
			who := "unknown"
			if b, _, gerr := s.Get(ctx, LockPath(p)); gerr == nil {
				var h Holder
				if json.Unmarshal(b, &h) == nil {
					who = fmt.Sprintf("%s pid %d since %s", h.Host, h.PID, h.Since.Format(time.RFC3339))
				}
			}
			return nil, fmt.Errorf("%w (%s at %s)", ErrLocked, who, LockPath(p))
		}
		return nil, err
	}
	l := &Lock{e: e, sub: sub, lost: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for ch := range sub.C {
			if ch.To == zksession.StateLost || ch.To == zksession.StateClosed {
				close(l.lost)
				return
			}
		}
	}()
	return l, nil
}

// Lost is closed when the lock can no longer be trusted.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Release gives the lock up.
func (l *Lock) Release(ctx context.Context) error {
	err := l.e.Delete(ctx)
	l.sub.Close()
	<-l.done
	return err
}
