package router

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/workerproto"
)

func TestFromWorkerEnv(t *testing.T) {
	t.Setenv(workerproto.EnvMapFile, "")
	if _, err := FromWorkerEnv(Options{}); !errors.Is(err, ErrNoMapFile) {
		t.Fatalf("without %s: %v, want ErrNoMapFile", workerproto.EnvMapFile, err)
	}
	m, err := bucketmap.New(4, clustertest.Nodes(3), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(workerproto.EnvMapFile, clustertest.WriteMapFile(t, t.TempDir(), m))
	r, err := FromWorkerEnv(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Source() != SourceFile || r.Keystream() == nil {
		t.Fatalf("source %s, keystream %v", r.Source(), r.Keystream())
	}
	want, _ := fileRouter(t, m).Route("alice")
	if got, err := r.Route("alice"); err != nil || got != want {
		t.Fatalf("route %+v, %v; want %+v", got, err, want)
	}
}

func TestDialRefusesBadConfig(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg    Config
		errHas string
	}{
		{Config{Connect: "127.0.0.1:1", Cluster: "Bad Name"}, "cluster name"},
		{Config{Connect: "127.0.0.1:1", Cluster: "c1", Root: "rel"}, "absolute"},
		{Config{Connect: "127.0.0.1:1", Cluster: "c1", Auth: "nopassword"}, "user:password"},
		{Config{Connect: "127.0.0.1", Cluster: "c1"}, "host:port"},
	} {
		if r, err := Dial(ctx, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.errHas) {
			if r != nil {
				r.Close()
			}
			t.Errorf("Dial(%+v): %v, want an error mentioning %q", tc.cfg, err, tc.errHas)
		}
	}
}

func TestIntegrationDial(t *testing.T) {
	e, z := realEnv(t)
	st := cluster(t, e, clustertest.Nodes(3), 4)
	r, err := Dial(ctxTimeout(t, 15*time.Second), Config{Connect: z.ConnectString, Root: z.Root, Cluster: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rt, err := r.Route("alice")
	if b := m.BucketOf(r.Keystream(), "alice"); err != nil || rt.Bucket != b.Prefix || rt.Level != b.Depth || rt.Node != m.OwnerOf(b) || rt.MapVersion != m.Version {
		t.Fatalf("route %+v, %v; want bucket %s on %s", rt, err, b, m.OwnerOf(b))
	}
	r.Close()

	// A cluster that does not exist: Dial gives up when ctx ends and says why.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if r, err := Dial(ctx, Config{Connect: z.ConnectString, Root: z.Root, Cluster: "nope"}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		if r != nil {
			r.Close()
		}
		t.Fatalf("Dial of a missing cluster: %v", err)
	}
}
