package zksession

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/backoff"
)

// Node is one observed version of a znode.
type Node struct {
	Path     string
	Exists   bool
	Data     []byte   // Watch only
	Children []string // WatchChildren only
	Stat     Stat
}

// Watch delivers new versions of one znode. C holds at most one Node, the
// newest not yet received: a slow reader skips intermediate versions but
// never misses the latest one. (ZooKeeper itself only guarantees that much:
// two writes between re-reads show as one.)
type Watch struct {
	C      <-chan Node
	c      chan Node
	cancel context.CancelFunc
	done   chan struct{}
}

// Stop ends the watch and waits for its goroutine.
func (w *Watch) Stop() {
	w.cancel()
	<-w.done
}

// Watch follows the data of p. The first Node (existing or not) arrives as
// soon as it is read; after that, a Node arrives whenever the data, or the
// node's existence, changes. Re-reads after every event, after every return
// to Connected (so a new session misses nothing), and dedupes by zxid.
func (s *Session) Watch(ctx context.Context, p string) *Watch {
	return s.watch(ctx, p, false)
}

// WatchChildren follows the list of p's children the same way.
func (s *Session) WatchChildren(ctx context.Context, p string) *Watch {
	return s.watch(ctx, p, true)
}

type fetched struct {
	node Node
	ev   <-chan zk.Event
}

func (s *Session) watch(ctx context.Context, p string, children bool) *Watch {
	ctx, cancel := context.WithCancel(ctx)
	c := make(chan Node, 1)
	w := &Watch{C: c, c: c, cancel: cancel, done: make(chan struct{})}
	resync := make(chan struct{}, 1)
	s.mu.Lock()
	s.resyncs[resync] = struct{}{}
	s.mu.Unlock()
	go func() {
		defer close(w.done)
		defer func() {
			s.mu.Lock()
			delete(s.resyncs, resync)
			s.mu.Unlock()
		}()
		var last *Node
		b := backoff.New(50*time.Millisecond, time.Second)
		for {
			if s.State() != StateConnected {
				// Reading now would only queue in the library; the
				// return to Connected pokes resync.
				select {
				case <-resync:
				case <-ctx.Done():
					return
				case <-s.closed:
					return
				}
				continue
			}
			f, err := s.fetchW(ctx, p, children)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, ErrClosed) {
					return
				}
				s.log.Debug("watch read failed; retrying", zap.String("path", p), zap.Error(err))
				select {
				case <-time.After(b.Next()):
				case <-resync:
				case <-ctx.Done():
					return
				}
				continue
			}
			b.Reset()
			if last == nil || changed(*last, f.node, children) {
				n := f.node
				last = &n
				select { // replace an undelivered older version
				case <-c:
				default:
				}
				c <- n
			}
			select {
			case <-f.ev:
			case <-resync:
			case <-ctx.Done():
				return
			case <-s.closed:
				return
			}
		}
	}()
	return w
}

func changed(a, b Node, children bool) bool {
	if a.Exists != b.Exists {
		return true
	}
	if !b.Exists {
		return false
	}
	if a.Stat.Czxid != b.Stat.Czxid {
		return true // deleted and re-created
	}
	if children {
		return a.Stat.Pzxid != b.Stat.Pzxid || !slices.Equal(a.Children, b.Children)
	}
	return a.Stat.Mzxid != b.Stat.Mzxid
}

// fetchW reads p and arms a watch, covering the node appearing between a
// failed read and the existence watch.
func (s *Session) fetchW(ctx context.Context, p string, children bool) (fetched, error) {
	return call(s, ctx, "watch", p, false, func(c Conn, ap string) (fetched, error) {
		for i := range 3 {
			if i > 0 {
				s.count("watch") // call counted the first read
			}
			var (
				f   = fetched{node: Node{Path: p, Exists: true}}
				st  *zk.Stat
				err error
			)
			if children {
				f.node.Children, st, f.ev, err = c.ChildrenW(ap)
			} else {
				f.node.Data, st, f.ev, err = c.GetW(ap)
			}
			if err == nil {
				f.node.Stat = statOf(st)
				return f, nil
			}
			if !errors.Is(err, zk.ErrNoNode) {
				return f, err
			}
			s.count("watch")
			ok, _, ev, err := c.ExistsW(ap)
			if err != nil {
				return f, err
			}
			if !ok {
				return fetched{node: Node{Path: p}, ev: ev}, nil
			}
			// Created in between: read it (the exists watch is armed too,
			// harmlessly).
		}
		return fetched{}, errors.New("node keeps appearing and disappearing")
	})
}
