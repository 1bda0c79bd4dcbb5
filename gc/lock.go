package gc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// ErrLocked means another process holds the GC lock.
var ErrLocked = errors.New("another GC holds the lock")

// Lock is the cluster's GC lock (topo.Paths.GCLock): an ephemeral node, so
// at most one GC runs at a time and a crashed holder's lock goes away with
// its session. Run takes it itself.
type Lock struct {
	l *zksession.Lock
}

// Holder is the lock node's content, for people.
type Holder struct {
	Host  string    `json:"host"`
	PID   int       `json:"pid"`
	Since time.Time `json:"since"`
}

// LockPath is where the lock lives.
func LockPath(p topo.Paths) string { return p.GCLock() }

// Acquire takes the GC lock or fails at once with ErrLocked naming the
// holder. Lost is closed if the session is lost while it is held (the
// server may then give the lock to another process): stop at once.
func Acquire(ctx context.Context, s *zksession.Session, p topo.Paths) (*Lock, error) {
	host, _ := os.Hostname()
	data, _ := json.Marshal(Holder{Host: host, PID: os.Getpid(), Since: time.Now().UTC()})
	l, err := topo.LockGC(ctx, s, p, data)
	var le *zksession.LockedError
	switch {
	case err == nil:
		return &Lock{l: l}, nil
	case errors.Is(err, zksession.ErrAlreadyHeld):
		return nil, fmt.Errorf("%w (this process, at %s)", ErrLocked, p.GCLock())
	case errors.As(err, &le):
		who := "unknown"
		var h Holder
		if le.Holder != nil && json.Unmarshal(le.Holder, &h) == nil {
			who = fmt.Sprintf("%s pid %d since %s", h.Host, h.PID, h.Since.Format(time.RFC3339))
		}
		return nil, fmt.Errorf("%w (%s at %s)", ErrLocked, who, p.GCLock())
	}
	return nil, err
}

// Lost is closed when the lock can no longer be trusted.
func (l *Lock) Lost() <-chan struct{} { return l.l.Done() }

// Release gives the lock up.
func (l *Lock) Release(ctx context.Context) error { return l.l.Release(ctx) }
