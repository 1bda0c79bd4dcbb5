package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/workerproto"
	"github.com/shardvisor/shardvisor/zksession"
)

// Config is what an application needs to follow a cluster's map in
// ZooKeeper without building a session itself (see Dial).
type Config struct {
	// Connect is the ZooKeeper connect string: "host:port,host:port[/chroot]".
	Connect string
	// Cluster is the cluster's name; Root its parent path ("" means
	// topo.DefaultRoot, /shardvisor).
	Cluster string
	Root    string
	// Auth is a ZooKeeper digest identity "user:password"; AuthFile names a
	// file whose first line holds one (used when Auth is empty). Neither:
	// no identity, which is enough for a cluster readable by anyone.
	Auth     string
	AuthFile string
	// SessionTimeout asked of ZooKeeper (0: zksession.DefaultSessionTimeout).
	SessionTimeout time.Duration
	// Logger receives the router's and the session's logs (nil: none).
	Logger *zap.Logger
	// MemberID, when set, registers the router's ephemeral member record
	// (so that a move waits until this process has seen its map); MemberAddr
	// is published with it.
	MemberID   string
	MemberAddr string
	// Keep is how many recent map versions are kept for the stale-map
	// protocol (0: 16).
	Keep int
	// TunePool adjusts each node's pool configuration (sizes, timeouts).
	TunePool func(*pgxpool.Config)
}

// Dial opens a ZooKeeper session of its own, follows the cluster's map
// through it, and returns once the first map is loaded, or fails when ctx
// ends first. Close ends the session too. Processes that already hold a
// session (and should not open a second) use New.
func Dial(ctx context.Context, cfg Config) (*Router, error) {
	p, err := topo.NewPaths(cfg.Root, cfg.Cluster)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	cred, err := zksession.LoadCredential(cfg.Auth, cfg.AuthFile)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	zc := zksession.Config{Connect: cfg.Connect, SessionTimeout: cfg.SessionTimeout, Logger: cfg.Logger}
	if cred != nil {
		zc.Auth = []zksession.Credential{*cred}
	}
	s, err := zksession.Open(zc)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	r := New(s, p, Options{Logger: cfg.Logger, MemberID: cfg.MemberID, MemberAddr: cfg.MemberAddr, Keep: cfg.Keep, TunePool: cfg.TunePool})
	r.ownSession = true
	if err := r.WaitReady(ctx); err != nil {
		// Say why the map did not come, when the router knows.
		if last := r.stats.LastError.Load(); last != nil {
			err = fmt.Errorf("%w (last error: %s)", err, *last)
		}
		r.Close()
		return nil, fmt.Errorf("router: cluster %s: %w", p.Cluster(), err)
	}
	return r, nil
}

// ErrNoMapFile means the process was not given a map file: it is not a
// worker started by the supervisor.
var ErrNoMapFile = errors.New("router: " + workerproto.EnvMapFile + " is not set (not run by a shardvisor supervisor?)")

// FromWorkerEnv is NewFromFile on the map file the supervisor hands its
// workers (workerproto.EnvMapFile). The map is fixed for the worker's
// lifetime: a new map brings a new generation of workers.
func FromWorkerEnv(opts Options) (*Router, error) {
	f := os.Getenv(workerproto.EnvMapFile)
	if f == "" {
		return nil, ErrNoMapFile
	}
	return NewFromFile(f, opts)
}
