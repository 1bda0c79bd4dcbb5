package supervisor

import (
	"context"
	"errors"
	"os"
	"path"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// publisher writes the member record (ephemeral) and the pool status
// record to ZooKeeper off the loop, so that a slow or suspended session
// never delays a decision. Only the newest of each is written; member
// updates are coalesced to at most one write per 200ms.
type publisher struct {
	s      *Supervisor
	kick   chan struct{}
	mu     sync.Mutex
	member []byte
	status []byte
	eph    *zksession.Ephemeral
	done   chan struct{}
}

func newPublisher(s *Supervisor) *publisher {
	return &publisher{s: s, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

func (p *publisher) setMember(b []byte) {
	p.mu.Lock()
	p.member = b
	p.mu.Unlock()
	p.poke()
}

func (p *publisher) setStatus(b []byte) {
	p.mu.Lock()
	p.status = b
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
	ss := p.s.opts.Session
	memberPath := p.s.opts.Paths.PoolMember(p.s.opts.Pool, p.s.opts.Member)
	statusPath := p.s.opts.Paths.PoolStatus(p.s.opts.Pool)
	var written []byte
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
		failed := false
		if ss.State() == zksession.StateConnected {
			if status != nil {
				if err := p.writeStatus(ctx, statusPath, status); err != nil {
					p.s.log.Warn("publishing the pool status failed; will retry", zap.String("path", statusPath), zap.Error(err))
					p.mu.Lock()
					if p.status == nil {
						p.status = status
					}
					p.mu.Unlock()
					failed = true
				}
			}
			if member != nil && string(member) != string(written) {
				if err := p.writeMember(ctx, memberPath, member); err != nil {
					p.s.log.Warn("publishing the member record failed; will retry", zap.String("path", memberPath), zap.Error(err))
					failed = true
				} else {
					written = member
				}
			}
		} else if status != nil {
			p.mu.Lock()
			if p.status == nil {
				p.status = status
			}
			p.mu.Unlock()
			failed = true
		} else if member != nil && string(member) != string(written) {
			failed = true
		}
		d := 200 * time.Millisecond
		if failed {
			d = time.Second
		}
		retry.Reset(d)
		// Coalesce: wait a little before the next write.
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (p *publisher) writeMember(ctx context.Context, at string, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if p.eph == nil {
		e, err := p.s.opts.Session.CreateEphemeral(ctx, at, data, nil)
		if err != nil {
			return err
		}
		p.eph = e
		return nil
	}
	return p.eph.Set(ctx, data)
}

func (p *publisher) writeStatus(ctx context.Context, at string, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ss := p.s.opts.Session
	_, err := ss.Set(ctx, at, data, zksession.AnyVersion)
	if errors.Is(err, zksession.ErrNoNode) {
		if err = ss.CreateAll(ctx, path.Dir(at)); err != nil {
			return err
		}
		err = ss.Create(ctx, at, data)
		if errors.Is(err, zksession.ErrNodeExists) {
			_, err = ss.Set(ctx, at, data, zksession.AnyVersion)
		}
	}
	return err
}

// deleteMember removes the member record at a clean stop (it would go away
// with the session anyway).
func (p *publisher) deleteMember() {
	<-p.done
	if p.eph == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = p.eph.Delete(ctx)
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
	if b, err := topo.Encode(st); err == nil {
		s.pub.setStatus(b)
	}
}

// publishSnapshot refreshes the member record and health from the
// machine's view.
func (s *Supervisor) publishSnapshot(now time.Time) {
	m, h, acts := s.mc.snapshot()
	m.Member, m.Host, m.PID, m.Admin, m.StartedAt = s.opts.Member, s.host, os.Getpid(), s.AdminAddr(), s.startedAt.UTC()
	s.snapMu.Lock()
	old := s.snap
	s.snap = m
	s.health = h
	s.snapMu.Unlock()
	changed := old.State != m.State || old.Generation != m.Generation || old.Accepting != m.Accepting ||
		old.Target != m.Target || old.LastError != m.LastError || !sameWorkers(old.Workers, m.Workers)
	if changed && s.pub != nil {
		m.UpdatedAt = now.UTC()
		if b, err := topo.Encode(m); err == nil {
			s.pub.setMember(b)
		}
	}
	s.apply(acts, now)
}

func sameWorkers(a, b []topo.WorkerInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].State != b[i].State {
			return false
		}
	}
	return true
}
