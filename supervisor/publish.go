package supervisor

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// publisher writes the member record (ephemeral) and the pool status
// record to ZooKeeper off the loop, so that a slow or suspended session
// never delays a decision. Only the newest of each is written; updates
// are coalesced to at most one write per 200ms, except a member record
// that acknowledges a new map version: a mover waits for it before every
// move's freeze (its member wait), and the coalescing alone added 100 ms
// to 200 ms to each move of a rebalance, whose moves follow one another.
type publisher struct {
	s      *Supervisor
	kick   chan struct{}
	urgent chan struct{} // a new map version to acknowledge
	mu     sync.Mutex
	member *topo.PoolMember
	status *topo.PoolStatus
	reg    *topo.PoolMemberRegistration
	// ackedMap is the map version of the member record written last.
	ackedMap uint64
	// coalesce is the least time between two writes (but an urgent one).
	coalesce time.Duration
	done     chan struct{}
}

func newPublisher(s *Supervisor) *publisher {
	return &publisher{s: s, kick: make(chan struct{}, 1), urgent: make(chan struct{}, 1), coalesce: 200 * time.Millisecond, done: make(chan struct{})}
}

func (p *publisher) setMember(m topo.PoolMember) {
	p.mu.Lock()
	p.member = &m
	newMap := m.MapVersion != p.ackedMap
	p.mu.Unlock()
	p.poke()
	if newMap {
		select {
		case p.urgent <- struct{}{}:
		default:
		}
	}
}

func (p *publisher) setStatus(st topo.PoolStatus) {
	p.mu.Lock()
	p.status = &st
	p.mu.Unlock()
	p.poke()
}

func (p *publisher) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *publisher) run(ctx context.Context) {
	defer close(p.done)
	ss, paths, pool := p.s.opts.Session, p.s.opts.Paths, p.s.opts.Pool
	var written *topo.PoolMember
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-retry.C:
		}
		p.mu.Lock()
		member, status := p.member, p.status
		p.status = nil
		p.mu.Unlock()
		keepStatus := func() {
			p.mu.Lock()
			if p.status == nil {
				p.status = status
			}
			p.mu.Unlock()
		}
		failed := false
		if ss.State() == zksession.StateConnected {
			if status != nil {
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := topo.WritePoolStatus(wctx, ss, paths, pool, *status)
				cancel()
				if err != nil {
					p.s.log.Warn("publishing the pool status failed; will retry", zap.String("path", paths.PoolStatus(pool)), zap.Error(err))
					keepStatus()
					failed = true
				}
			}
			if member != nil && member != written {
				if err := p.writeMember(ctx, *member); err != nil {
					p.s.log.Warn("publishing the member record failed; will retry", zap.String("path", paths.PoolMember(pool, member.Member)), zap.Error(err))
					failed = true
				} else {
					written = member
					p.mu.Lock()
					p.ackedMap = member.MapVersion
					p.mu.Unlock()
				}
			}
		} else if status != nil {
			keepStatus()
			failed = true
		} else if member != nil && member != written {
			failed = true
		}
		d := p.coalesce
		if failed {
			d = time.Second
		}
		retry.Reset(d)
		// Coalesce: wait a little before the next write, unless a map
		// version waits to be acknowledged (and the last write went
		// through: a failing one is retried at its own pace).
		urgent := p.urgent
		if failed {
			urgent = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.coalesce):
		case <-urgent:
		}
	}
}

func (p *publisher) writeMember(ctx context.Context, m topo.PoolMember) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if p.reg == nil {
		reg, err := topo.RegisterPoolMember(ctx, p.s.opts.Session, p.s.opts.Paths, p.s.opts.Pool, m)
		if err != nil {
			return err
		}
		p.reg = reg
		return nil
	}
	err := p.reg.Update(ctx, m)
	if errors.Is(err, zksession.ErrOwnedElsewhere) {
		// Our session expired while we were away, and another supervisor
		// claimed the name meanwhile (member.go): we are the second one.
		p.s.memberTakenOver(err)
	}
	return err
}

// deleteMember removes the member record at a clean stop (it would go away
// with the session anyway).
func (p *publisher) deleteMember() {
	<-p.done
	if p.reg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = p.reg.Remove(ctx)
}

// publishStatus records a swap result for /status and (ZooKeeper mode)
// for `shardctl pool status`.
func (s *Supervisor) publishStatus(st topo.PoolStatus) {
	st.Member = s.opts.Member
	s.snapMu.Lock()
	s.lastStatus = st
	s.snapMu.Unlock()
	if s.pub == nil {
		return
	}
	s.pub.setStatus(st)
}

// publishSnapshot refreshes the member record and health from the
// machine's view.
func (s *Supervisor) publishSnapshot(now time.Time) {
	m, h, acts := s.mc.snapshot()
	m.Member, m.Host, m.PID, m.Admin, m.StartedAt = s.opts.Member, s.host, os.Getpid(), s.AdminAddr(), s.startedAt.UTC()
	s.snapMu.Lock()
	old := s.snap
	changed := old.State != m.State || old.Generation != m.Generation || old.Accepting != m.Accepting ||
		old.Target != m.Target || old.LastError != m.LastError || old.MapVersion != m.MapVersion || old.ZK != m.ZK ||
		old.MapDelivery != m.MapDelivery || !sameFailStatic(old.FailStatic, m.FailStatic) || !sameWorkers(old.Workers, m.Workers) ||
		!sameRollback(old.RolledBack, m.RolledBack) || s.updatedAt.IsZero()
	if changed {
		s.updatedAt = now.UTC()
	}
	// The same updated_at in /status and in ZooKeeper: when the record
	// last changed.
	m.UpdatedAt = s.updatedAt
	s.snap = m
	s.health = h
	s.snapMu.Unlock()
	if changed && s.pub != nil {
		s.pub.setMember(m)
	}
	s.apply(acts, now)
}

func sameFailStatic(a, b *topo.FailStatic) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameRollback(a, b *topo.Rollback) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameWorkers(a, b []topo.WorkerInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].State != b[i].State || a[i].MapVersion != b[i].MapVersion {
			return false
		}
	}
	return true
}
