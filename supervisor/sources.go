package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

func uintptrOf(ts *syscall.Timespec) uintptr { return uintptr(unsafe.Pointer(ts)) }

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
func (s *Supervisor) startZKSources(ctx context.Context, wg *sync.WaitGroup) {
	ss := s.opts.Session
	sub := ss.Subscribe()
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
				s.post(evZK{ch})
			case <-ctx.Done():
				return
			}
		}
	}()
	cfgPath := s.opts.Paths.PoolConfig(s.opts.Pool)
	go func() {
		defer wg.Done()
		w := ss.Watch(ctx, cfgPath)
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
		w := ss.Watch(ctx, s.opts.Paths.Map())
		defer w.Stop()
		for {
			select {
			case n := <-w.C:
				s.post(evMap{exists: n.Exists, data: n.Data})
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
	if err := ss.Sync(ctx, cfgPath); err != nil && !errors.Is(err, zksession.ErrNoNode) {
		r.err = err
		return r
	}
	data, st, err := ss.Get(ctx, cfgPath)
	switch {
	case errors.Is(err, zksession.ErrNoNode):
		r.cfg = evConfig{}
	case err != nil:
		r.err = err
		return r
	default:
		r.cfg = configEvent(cfgPath, data, int64(st.Version))
	}
	data, _, err = ss.Get(ctx, mapPath)
	switch {
	case errors.Is(err, zksession.ErrNoNode):
		r.mp = evMap{}
	case err != nil:
		r.err = err
	default:
		r.mp = evMap{exists: true, data: data}
	}
	return r
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
