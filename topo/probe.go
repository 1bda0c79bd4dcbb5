package topo

import (
	"context"
	"fmt"
	"time"

	"github.com/shardvisor/shardvisor/zksession"
)

// ProbeStep is one timed step of Probe.
type ProbeStep struct {
	Step     string // create, read, delete
	Path     string
	Duration time.Duration
}

// Probe checks that ZooKeeper takes writes, as `shardctl zk ping` reports:
// it creates an ephemeral scratch node at Paths.Probe(id), reads it back and
// deletes it, timing each step. An error names the step that failed; the
// steps before it are returned too. The node is ephemeral, so a probe
// killed half-way leaves nothing once its session ends.
func Probe(ctx context.Context, s *zksession.Session, p Paths, id string) ([]ProbeStep, error) {
	at := p.Probe(id)
	payload := []byte(fmt.Sprintf(`{"version":1,"at":%q}`, time.Now().UTC().Format(time.RFC3339Nano)))
	var steps []ProbeStep
	step := func(name string, f func() error) error {
		t := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		steps = append(steps, ProbeStep{Step: name, Path: at, Duration: time.Since(t)})
		return nil
	}
	var eph *zksession.Ephemeral
	if err := step("create", func() (err error) {
		eph, err = createEphemeral(ctx, s, p, at, payload)
		return err
	}); err != nil {
		return steps, err
	}
	if err := step("read", func() error {
		got, _, err := s.Get(ctx, at)
		if err == nil && string(got) != string(payload) {
			err = fmt.Errorf("read back %q, wrote %q", got, payload)
		}
		return err
	}); err != nil {
		_ = eph.Delete(ctx)
		return steps, err
	}
	return steps, step("delete", func() error { return eph.Delete(ctx) })
}

// Scratch is an ephemeral scratch node at Paths.Probe(id) for timing
// writes (a benchmark's ZooKeeper write latency under load). It is beside
// the clusters, like Probe's, and goes away with the session.
type Scratch struct {
	e *zksession.Ephemeral
}

// CreateScratch creates the scratch node with data.
func CreateScratch(ctx context.Context, s *zksession.Session, p Paths, id string, data []byte) (*Scratch, error) {
	e, err := createEphemeral(ctx, s, p, p.Probe(id), data)
	if err != nil {
		return nil, err
	}
	return &Scratch{e: e}, nil
}

// Write replaces the node's data: one write round trip.
func (sc *Scratch) Write(ctx context.Context, data []byte) error { return sc.e.Set(ctx, data) }

// Remove deletes the node.
func (sc *Scratch) Remove(ctx context.Context) error { return sc.e.Delete(ctx) }
