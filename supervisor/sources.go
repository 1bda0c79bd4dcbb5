package supervisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// configEvent decodes config bytes into an event for the loop; validation
// happens here, before anything can start a swap.
func configEvent(where string, data []byte, version int64) evConfig {
	cfg, err := topo.DecodePoolConfig(where, data)
	if err != nil {
		return evConfig{err: err, version: version}
	}
	return evConfig{cfg: cfg, version: version, hash: hashBytes(data)}
}

// startZKSources follows the session state, the pool config and the map.
func (s *Supervisor) startZKSources(ctx context.Context, wg *sync.WaitGroup, sub *zksession.Subscription) {
	ss := s.opts.Session
	if s.mc.cfg.failStatic {
		wg.Add(1)
		go func() { defer wg.Done(); s.refreshPeers(ctx) }()
	}
	wg.Add(3)
	go func() {
		defer wg.Done()
		defer sub.Close()
		for {
			select {
			case ch, ok := <-sub.C:
				if !ok {
					return
				}
				if ch.To == zksession.StateConnected {
					// The timeout the ensemble granted: every bound of
					// docs/supervisor.md is a fraction of it.
					s.m.zkSessionTimeout.Set(ss.SessionTimeout().Seconds())
				}
				s.post(evZK{ch})
			case <-ctx.Done():
				return
			}
		}
	}()
	cfgPath := s.opts.Paths.PoolConfig(s.opts.Pool)
	go func() {
		defer wg.Done()
		w := topo.WatchPoolConfig(ctx, ss, s.opts.Paths, s.opts.Pool)
		defer w.Stop()
		for {
			select {
			case n := <-w.C:
				if !n.Exists {
					s.post(evConfig{})
					continue
				}
				s.post(configEvent(cfgPath, n.Data, int64(n.Stat.Version)))
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		w := topo.WatchMap(ctx, ss, s.opts.Paths)
		defer w.Stop()
		for {
			select {
			case n := <-w.C:
				ev, ok := s.mapEvent(ctx, n.Exists, n.Data)
				if !ok {
					return
				}
				s.post(ev)
			case <-ctx.Done():
				return
			}
		}
	}()
}

// readZK reads config and map afresh (after a Sync, so another process's
// latest write is seen): used after a session loss and on HUP.
func (s *Supervisor) readZK(timeout time.Duration) evResync {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ss := s.opts.Session
	cfgPath, mapPath := s.opts.Paths.PoolConfig(s.opts.Pool), s.opts.Paths.Map()
	var r evResync
	if err := topo.Sync(ctx, ss, s.opts.Paths); err != nil {
		r.err = err
		return r
	}
	data, ver, err := topo.ReadPoolConfigData(ctx, ss, s.opts.Paths, s.opts.Pool)
	switch {
	case errors.Is(err, zksession.ErrNoNode):
		r.cfg = evConfig{}
	case err != nil:
		r.err = err
		return r
	default:
		r.cfg = configEvent(cfgPath, data, int64(ver))
	}
	data, _, err = topo.ReadMapData(ctx, ss, s.opts.Paths)
	switch {
	case errors.Is(err, topo.ErrNoCluster):
		r.mp = evMap{}
	case err != nil:
		r.err = err
	default:
		cl, err := s.clusterRecord(ctx)
		if err != nil {
			r.err = err
			return r
		}
		r.mp = mapEvent(cl, mapPath, data)
	}
	return r
}

// mapEvent validates the map record and builds the map file document,
// here rather than on the loop, which never waits for ZooKeeper.
func mapEvent(cl *topo.ClusterRecord, znode string, data []byte) evMap {
	v, doc, err := MapDocument(cl, znode, data)
	return evMap{exists: true, version: v, data: data, doc: doc, err: err}
}

// mapEvent turns a map watch notification into an event. The map file
// needs the cluster's seed, so the cluster record is read first, retried
// with backoff while it fails (a transient error must not reject a good
// map); ok is false only when ctx ends first.
func (s *Supervisor) mapEvent(ctx context.Context, exists bool, data []byte) (evMap, bool) {
	if !exists {
		return evMap{}, true
	}
	b := backoff.New(100*time.Millisecond, 5*time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cl, err := s.clusterRecord(cctx)
		cancel()
		if err == nil {
			return mapEvent(cl, s.opts.Paths.Map(), data), true
		}
		s.log.Warn("reading the cluster record for the map file's seed failed; retrying", zap.Error(err))
		if b.Wait(ctx) != nil {
			return evMap{}, false
		}
	}
}

// clusterRecord reads the cluster record once; the seed never changes.
func (s *Supervisor) clusterRecord(ctx context.Context) (*topo.ClusterRecord, error) {
	s.clusterMu.Lock()
	defer s.clusterMu.Unlock()
	if s.cluster != nil {
		return s.cluster, nil
	}
	cl, err := topo.ReadCluster(ctx, s.opts.Session, s.opts.Paths)
	if err != nil {
		return nil, err
	}
	s.cluster = cl
	return cl, nil
}

// reload re-reads the config (and map) and posts them with a forced swap
// (HUP), off the loop.
func (s *Supervisor) reload() {
	if s.opts.Session == nil {
		go func() {
			ev := s.readFile()
			ev.force = true
			s.post(ev)
		}()
		return
	}
	go func() {
		r := s.readZK(10 * time.Second)
		if r.err != nil {
			s.log.Warn("reload: reading ZooKeeper failed; nothing changes", zap.Error(r.err))
			return
		}
		s.post(r.mp)
		r.cfg.force = true
		s.post(r.cfg)
	}()
}

// readFile reads the local config file. Its version is a counter of
// distinct contents seen, so that status and metrics have a number.
func (s *Supervisor) readFile() evConfig {
	data, err := os.ReadFile(s.opts.ConfigFile)
	if err != nil {
		return evConfig{err: fmt.Errorf("reading %s: %w", s.opts.ConfigFile, err)}
	}
	return s.fileEvent(data)
}

func (s *Supervisor) fileEvent(data []byte) evConfig {
	s.fileMu.Lock()
	if s.fileLast == nil || !bytes.Equal(s.fileLast, data) {
		s.fileN++
		s.fileLast = append([]byte(nil), data...)
	}
	n := s.fileN
	s.fileMu.Unlock()
	return configEvent(s.opts.ConfigFile, data, n)
}

// pollFile watches the config file by mtime, size and content; polling is
// dependency-free and works on every filesystem (inotify misses editors
// that replace the file, and network filesystems).
func (s *Supervisor) pollFile(ctx context.Context) {
	var lastMod time.Time
	var lastSize int64 = -1
	var lastHash string
	first := true
	t := time.NewTicker(s.opts.ConfigPoll)
	defer t.Stop()
	for {
		fi, err := os.Stat(s.opts.ConfigFile)
		switch {
		case err != nil && first:
			s.post(evConfig{err: fmt.Errorf("config file: %w", err)})
		case err != nil:
			if lastSize != -2 {
				s.log.Warn("config file unreadable; keeping the last config", zap.Error(err))
			}
			lastSize = -2
		case first || !fi.ModTime().Equal(lastMod) || fi.Size() != lastSize:
			lastMod, lastSize = fi.ModTime(), fi.Size()
			data, err := os.ReadFile(s.opts.ConfigFile)
			if err != nil {
				s.post(evConfig{err: fmt.Errorf("reading %s: %w", s.opts.ConfigFile, err)})
				break
			}
			if h := hashBytes(data); h != lastHash || first {
				lastHash = h
				s.post(s.fileEvent(data))
			}
		}
		first = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// hashBytes names a config's contents, so that a change of content is a
// change even where the version number is not.
func hashBytes(b []byte) string {
	h := sha256.Sum256(b)
	return fmt.Sprintf("%x", h[:8])
}
