package clustertest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// SetSynchronousMode turns synchronous_mode of group node of the dev
// environment e on or off through its members' REST APIs (PATCH /config,
// which any member accepts): HTTP, or in a TLS environment HTTPS as the
// admin with the API's password, which its unsafe methods need.
func SetSynchronousMode(ctx context.Context, e *devenv.Env, node int, on bool) error {
	client, scheme, pw := http.DefaultClient, "http", ""
	if e.Config().TLS {
		cfg, err := e.TLSFiles(Admin).Config()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(e.APIPasswordFile())
		if err != nil {
			return err
		}
		cfg.ServerName = "127.0.0.1" // the members' certificates name their address
		client, scheme, pw = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}, "https", strings.TrimSpace(string(b))
	}
	members, err := e.Members(node)
	if err != nil {
		return err
	}
	var last error
	for m := 1; m <= members; m++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPatch, fmt.Sprintf("%s://127.0.0.1:%d/config", scheme, e.MemberAPIPort(node, m)),
			strings.NewReader(fmt.Sprintf(`{"synchronous_mode": %v}`, on)))
		if pw != "" {
			req.SetBasicAuth(devenv.PatroniAPIUser, pw)
		}
		res, err := client.Do(req)
		if last = err; err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("PATCH /config: %s", res.Status)
		}
	}
	return last
}

// WaitPatroniWhole waits until group scope (in namespace ns) has a leader
// and its other members run (and, with sync, are synchronous standbys),
// with synchronous_mode set to sync.
func WaitPatroniWhole(ctx context.Context, s *zksession.Session, ns, scope string, members int, sync bool, timeout time.Duration) (*topo.PatroniGroup, error) {
	notReady := func(m topo.PatroniMember) bool {
		return !m.Leader && (m.State != "running" && m.State != "streaming" || sync && !m.Sync)
	}
	for deadline := time.Now().Add(timeout); ; {
		g, err := topo.ReadPatroni(ctx, s, ns, scope)
		if err == nil && g.Leader != "" && len(g.Members) == members && g.Config != nil && g.Config.SynchronousMode == sync && !slices.ContainsFunc(g.Members, notReady) {
			return g, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("group %s not whole after %s (sync=%v): %+v %v", scope, timeout, sync, g, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
