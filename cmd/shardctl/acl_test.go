package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// acl check finds a znode whose ACL was loosened (as anyone could, on
// znodes an older shardctl created open) and exits 1; acl repair sets it
// right and says so; then check passes. Both need the admin identity.
func TestIntegrationACLCheckRepair(t *testing.T) {
	t.Parallel()
	z := testenv.StartZK(t)
	dir := t.TempDir()
	adminFile, readerFile, poolFile := filepath.Join(dir, "admin"), filepath.Join(dir, "reader"), filepath.Join(dir, "pool.json")
	os.WriteFile(adminFile, []byte("admin:adm1n\n"), 0o600)
	os.WriteFile(readerFile, []byte("reader:r3ad\n"), 0o600)
	os.WriteFile(poolFile, []byte(`{"version":1,"command":"/bin/app","workers":1}`), 0o644)
	base := []string{"--zk", z.ConnectString, "--zk-root", z.Root, "--cluster", "sec"}
	admin := append(append([]string{}, base...), "--zk-auth-file", adminFile)
	mustRun(t, append(admin, "init", "--seed", seed, "--reader-auth-file", readerFile, "--node", "n1=postgres://h1/d")...)
	mustRun(t, append(admin, "pool", "set", "web", "--file", poolFile)...)
	if out := mustRun(t, append(admin, "acl", "check")...); !strings.Contains(out, "every ACL follows the rule") {
		t.Fatalf("check of a new cluster: %q", out)
	}

	s := zktest.Session(t, zksession.Config{Connect: z.ConnectString, Auth: []zksession.Credential{{User: "admin", Password: "adm1n"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := topo.MustPaths(z.Root, "sec")
	if err := s.SetACL(ctx, p.PoolConfig("web"), zk.WorldACL(zk.PermAll), zksession.AnyVersion); err != nil {
		t.Fatal(err)
	}

	r := run(t, "", append(admin, "acl", "check")...)
	if r.code != 1 || !strings.Contains(r.stdout, "1 differ from the ACL rule") || !strings.Contains(r.stdout, "pools/web/config") ||
		!strings.Contains(r.stdout, "world:anyone:cdrwa") || !strings.Contains(r.stderr, "differ from the ACL rule\nhint: `shardctl acl repair` sets them right\n") {
		t.Fatalf("check of a loosened znode: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, "", append(admin, "acl", "check", "--json")...)
	var rep topo.ACLReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != 1 || err != nil || len(rep.Diffs) != 1 || rep.Diffs[0].Path != p.PoolConfig("web") ||
		rep.Diffs[0].Have[0].String() != "world:anyone:cdrwa" || len(rep.Diffs[0].Want) != 2 {
		t.Fatalf("check --json: exit %d %q: %+v %v", r.code, r.stdout, rep, err)
	}
	reader := append(append([]string{}, base...), "--zk-auth-file", readerFile)
	if r := run(t, "", append(reader, "acl", "repair")...); r.code != 1 || !strings.Contains(r.stderr, "needs the cluster's admin identity") {
		t.Fatalf("repair as the reader: exit %d %s", r.code, r.stderr)
	}
	if r := run(t, "", append(admin, "acl", "check", "extra")...); r.code != 2 {
		t.Fatalf("check with an argument: exit %d %s", r.code, r.stderr)
	}

	out := mustRun(t, append(admin, "acl", "repair")...)
	if !strings.Contains(out, "repaired 1") || !strings.Contains(out, "pools/web/config") {
		t.Fatalf("repair: %q", out)
	}
	acl, _, err := s.GetACL(ctx, p.PoolConfig("web"))
	if err != nil || topo.FormatACL(acl) != topo.FormatACL(zksession.ClusterACL(&zksession.Credential{User: "admin", Password: "adm1n"}, &zksession.Credential{User: "reader", Password: "r3ad"})) {
		t.Fatalf("after repair: %s %v", topo.FormatACL(acl), err)
	}
	if out := mustRun(t, append(admin, "acl", "repair")...); !strings.Contains(out, "every ACL follows the rule") {
		t.Fatalf("second repair: %q", out)
	}
	mustRun(t, append(admin, "acl", "check")...)
}

// init --x509-admin on a TLS-only ensemble: the operator's certificate is
// the cluster's admin, a web head's certificate reads and cannot write,
// and acl check finds every ACL as the rule says. Without TLS the flag is
// a usage error naming what it needs.
func TestIntegrationInitX509Admin(t *testing.T) {
	z := testenv.StartTLSZK(t)
	tlsArgs := func(f pki.Files) []string {
		return []string{"--zk", z.ConnectString, "--zk-root", "/sv", "--cluster", "x", "--zk-tls-ca", f.CA, "--zk-tls-cert", f.Cert, "--zk-tls-key", f.Key}
	}
	admin := tlsArgs(z.Identity(t, "admin", "operator"))
	out := mustRun(t, append(admin, "init", "--seed", seed, "--x509-admin", "--node", "n1=postgres://h1/d")...)
	if !strings.Contains(out, "writes need x509:CN=operator,OU=admin,O=shardvisor") {
		t.Fatalf("init --x509-admin: %q", out)
	}
	web := tlsArgs(z.Identity(t, "webhead", "web1"))
	if r := run(t, "", append(web, "node", "drain", "n1")...); r.code == 0 || !strings.Contains(r.stderr, "not authenticated") && !strings.Contains(r.stderr, "NoAuth") && !strings.Contains(r.stderr, "no auth") {
		t.Fatalf("a web head draining a node: exit %d %s", r.code, r.stderr)
	}
	if out := mustRun(t, append(web, "status")...); !strings.Contains(out, "cluster x") {
		t.Fatalf("a web head reads the status: %q", out)
	}
	if out := mustRun(t, append(admin, "acl", "check")...); !strings.Contains(out, "every ACL follows the rule") {
		t.Fatalf("acl check: %q", out)
	}
	r := run(t, "", "--zk", "127.0.0.1:1", "--cluster", "y", "init", "--seed", seed, "--x509-admin", "--node", "n1=postgres://h1/d")
	if r.code != 2 || !strings.Contains(r.stderr, "--x509-admin needs ZooKeeper over TLS") {
		t.Fatalf("--x509-admin without TLS: exit %d %s", r.code, r.stderr)
	}
}
