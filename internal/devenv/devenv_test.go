package devenv

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The golden files in testdata are what scripts/devenv (bash) wrote for
// state dir /tmp/sv-h1-gold and the default ports: zk2's zoo.cfg and
// log4j.properties, pg2's shardvisor.conf, member 2 of group 4's
// patroni.yml (password PASSWORD123; since, with the callbacks that have
// the member's PgBouncer reconnect, and the WAL archiving into pgBackRest's
// repository). A running server whose file differs is restarted or
// reloaded by up, so the rendering must not drift.
func TestTemplatesRenderAsTheScriptDid(t *testing.T) {
	e := New(Config{Dir: "/tmp/sv-h1-gold"})
	for name, got := range map[string][]byte{
		"zoo.cfg":          e.zooCfg(2),
		"log4j.properties": e.log4jProperties(2),
		"shardvisor.conf":  e.shardvisorConf(2),
		"patroni.yml":      e.patroniYML(4, 2, "PASSWORD123", ""),
	} {
		want, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the script's:\n--- got\n%s\n--- want\n%s", name, got, want)
		}
	}
}

func TestPorts(t *testing.T) {
	e := New(Config{Dir: "/s"})
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"zk1 client", e.ZKPort(1), 21811},
		{"zk3 client", e.ZKPort(3), 21813},
		{"zk2 quorum", e.zkQuorumPort(2), 22882},
		{"zk3 election", e.zkElectionPort(3), 23883},
		{"pg1", e.PGPort(1), 25432},
		{"pg4", e.PGPort(4), 25435},
		{"pg4 m1", e.MemberPort(4, 1), 25435},
		{"pg4 m2", e.MemberPort(4, 2), 25535},
		{"pg5 m2 api", e.MemberAPIPort(5, 2), 26536},
		{"pg4 m2 link to zk3", e.ZKLinkPort(4, 2, 3), 21811 + 3000 + 30 + 3 + 2},
		{"pg1 pool", e.PoolPort(1), 27432},
		{"pg3 pool", e.PoolPort(3), 27434},
		{"pg4 m1 pool", e.MemberPoolPort(4, 1), 27435},
		{"pg5 m2 pool", e.MemberPoolPort(5, 2), 27536},
	} {
		if c.got != c.want {
			t.Errorf("%s: port %d, want %d", c.name, c.got, c.want)
		}
	}
	e = New(Config{Dir: "/s", ZKPortBase: 31811, PGPortBase: 28432})
	if got, want := e.ZKConnect(), "127.0.0.1:31811,127.0.0.1:31812,127.0.0.1:31813"; got != want {
		t.Errorf("ZKConnect = %q, want %q", got, want)
	}
	if got := e.MemberAPIPort(1, 1); got != 29432 {
		t.Errorf("pg1 m1 api = %d", got)
	}
}

func TestLayout(t *testing.T) {
	e := New(Config{Dir: "/s"})
	for got, want := range map[string]string{
		e.ZKDir(2):               "/s/zk/zk2",
		e.zkLog(1):               "/s/zk/zk1/zookeeper.log",
		e.SuperFile():            "/s/zk/superpass",
		e.PGDir(3):               "/s/pg/pg3",
		e.pgData(3):              "/s/pg/pg3/data",
		e.PasswordFile():         "/s/pg/password",
		e.PGPassFile():           "/s/pg/pgpass",
		e.MemberDir(4, 2):        "/s/pg/pg4/m2",
		e.zkLinkPidFile(4, 2, 3): "/s/pg/pg4/m2/zkfwd3.pid",
		MemberName(4, 2):         "pg4-m2",
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
	if New(Config{}).Dir() != DefaultDir {
		t.Errorf("default dir %q", New(Config{}).Dir())
	}
}

func TestParseEnvironment(t *testing.T) {
	if n, err := ParseNodes("5"); err != nil || n != 5 {
		t.Errorf("ParseNodes(5) = %d, %v", n, err)
	}
	for _, bad := range []string{"0", "-1", "x", "05", "+3"} {
		if _, err := ParseNodes(bad); err == nil || !strings.Contains(err.Error(), "SHARDVISOR_PG_NODES must be a positive integer, got '"+bad+"'") {
			t.Errorf("ParseNodes(%q): %v", bad, err)
		}
	}
	if n, err := ParseHA("2"); err != nil || n != 2 {
		t.Errorf("ParseHA(2) = %d, %v", n, err)
	}
	for _, bad := range []string{"0", "10", "x"} {
		if _, err := ParseHA(bad); err == nil {
			t.Errorf("ParseHA(%q) accepted", bad)
		}
	}
	if l, err := ParseHANodes("4,5"); err != nil || len(l) != 2 || l[0] != 4 || l[1] != 5 {
		t.Errorf("ParseHANodes(4,5) = %v, %v", l, err)
	}
	for _, bad := range []string{"4,", ",4", "4,x", "0"} {
		if _, err := ParseHANodes(bad); err == nil {
			t.Errorf("ParseHANodes(%q) accepted", bad)
		}
	}
	t.Setenv("SHARDVISOR_DEVENV_DIR", "/x")
	t.Setenv("SHARDVISOR_PG_HA", "2")
	t.Setenv("SHARDVISOR_PG_HA_NODES", "4,5")
	t.Setenv("SHARDVISOR_DEVENV_TIMEOUT", "7")
	c, err := FromEnv()
	if err != nil || c.Dir != "/x" || c.HA != 2 || len(c.HANodes) != 2 || c.Timeout.Seconds() != 7 {
		t.Errorf("FromEnv = %+v, %v", c, err)
	}
}

// A node's kind comes from its directory: members for a group, a data
// directory for a plain node; new nodes get what the configuration asks.
func TestNodeKinds(t *testing.T) {
	dir := t.TempDir()
	mk := func(p, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("pg/pg1/data/PG_VERSION", "15\n")
	mk("pg/pg5/members", "2\n")
	mk("pg/pgx/members", "2\n")
	e := New(Config{Dir: dir})
	if n := e.NodeCount(); n != 5 {
		t.Errorf("NodeCount = %d, want 5 (pg5 exists)", n)
	}
	if !e.IsGroup(5) || e.IsGroup(1) {
		t.Error("IsGroup")
	}
	for i, want := range map[int]int{1: 1, 2: 1, 5: 2} {
		if n, err := e.Members(i); err != nil || n != want {
			t.Errorf("Members(%d) = %d, %v; want %d", i, n, err, want)
		}
	}
	if got, want := e.existingKinds(), "plain nodes: 1; groups: pg5 (2 members)"; got != want {
		t.Errorf("existingKinds = %q, want %q", got, want)
	}
	e = New(Config{Dir: dir, HA: 2, HANodes: []int{4, 5}})
	if n, _ := e.Members(4); n != 2 {
		t.Errorf("new node 4 under HA=2 HA_NODES=4,5: %d members", n)
	}
	if n, _ := e.Members(3); n != 1 {
		t.Errorf("new node 3 outside HA_NODES: %d members", n)
	}
	if err := e.checkKind(5); err != nil {
		t.Errorf("checkKind(5): %v", err)
	}
	e = New(Config{Dir: dir, HA: 3})
	if err := e.checkKind(1); err == nil || !strings.Contains(err.Error(), "pg1 exists as a plain PostgreSQL node, but SHARDVISOR_PG_HA=3") {
		t.Errorf("checkKind(1) under HA=3: %v", err)
	}
	mk("pg/pg6/members", "x\n")
	if _, err := e.Members(6); err == nil {
		t.Error("a members file without a number accepted")
	}
}

// What pg-kill prints: tests and scripts parse "killed primary NAME".
func TestKilledLine(t *testing.T) {
	if got, want := (Killed{Node: 2, Port: 25433, PostmasterPid: 42, Children: 7}).String(),
		"pg2: killed (postmaster pid 42 and 7 children)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got, want := (Killed{Node: 5, Member: "pg5-m2", Port: 25536, PatroniPid: 10, Children: 3}).String(),
		"pg5: killed primary pg5-m2 (127.0.0.1:25536; Patroni pid 10, postmaster pid - and 3 children)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

func TestSuperDigest(t *testing.T) {
	// As the script computed it: printf 'super:abc' | sha1sum | base64 of the bytes.
	if got, want := superDigest("abc"), "2VgF0vR8DcNscibPW6lltB0qxsg="; got != want {
		t.Errorf("superDigest = %q, want %q", got, want)
	}
	if p := randomPassword(); len(p) != 24 || strings.Trim(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") != "" {
		t.Errorf("randomPassword %q", p)
	}
}

// The group assessment, on REST API answers as Patroni gives them.
func TestAssessGroup(t *testing.T) {
	ms := []member{
		{m: 1, name: "pg4-m1", label: "pg4.m1", pgPort: 1, api: apiEndpoint{port: 2}, pgPid: 100, patroniPid: 101},
		{m: 2, name: "pg4-m2", label: "pg4.m2", pgPort: 3, api: apiEndpoint{port: 4}, pgPid: 0, patroniPid: 0},
	}
	res := []apiAnswer{
		{200, map[string]any{"state": "running", "timeline": float64(3), "xlog": map[string]any{"location": float64(100)}}},
		{},
	}
	a := assess("pg4", ms, res)
	if a.lead != 0 || a.texts[0] != "primary running timeline 3" || a.texts[1] != "stopped" {
		t.Errorf("assess: %+v", a)
	}
	if !slices.Contains(a.problems, "pg4.m2: stopped") {
		t.Errorf("problems %q", a.problems)
	}
	a = assess("pg4", ms, []apiAnswer{{503, map[string]any{"role": "replica", "state": "running"}}, {}})
	if a.lead != -1 || a.texts[0] != "replica running, not streaming (no leader)" || !slices.Contains(a.problems, "pg4: no leader (primary)") {
		t.Errorf("no leader: %+v", a)
	}
	ms[1].patroniPid = 102
	a = assess("pg4", ms, []apiAnswer{{200, map[string]any{}}, {200, map[string]any{}}})
	if !slices.Contains(a.problems, "2 members answer as primary: pg4.m1 pg4.m2") {
		t.Errorf("two leaders: %q", a.problems)
	}
}

func TestTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 60 {
		b.WriteString(strings.Repeat("x", i%3) + "\n")
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tailTo(&out, p, 50); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 50 {
		t.Errorf("%d lines, want 50", n)
	}
}

func TestFromEnvZKFullJIT(t *testing.T) {
	for _, c := range []struct {
		v       string
		want    bool
		wantErr bool
	}{{"", false, false}, {"0", false, false}, {"1", true, false}, {"true", true, false}, {"yes", false, true}} {
		t.Setenv("SHARDVISOR_DEVENV_ZK_FULL_JIT", c.v)
		got, err := FromEnv()
		if c.wantErr {
			if err == nil || !strings.Contains(err.Error(), "SHARDVISOR_DEVENV_ZK_FULL_JIT") {
				t.Errorf("%q: error %v, want one naming the variable", c.v, err)
			}
			continue
		}
		if err != nil || got.ZKFullJIT != c.want {
			t.Errorf("%q: ZKFullJIT %v, err %v; want %v", c.v, got.ZKFullJIT, err, c.want)
		}
	}
}

// The auth file's verifier is PostgreSQL's: the same salt and iterations
// give what pg_authid held for password 'pencil' (PostgreSQL 15).
func TestScramVerifier(t *testing.T) {
	const pg = "SCRAM-SHA-256$4096:xYkwilCzVttQlbSoZbZdkw==$zayP7JOkqYa6a2ja/TjaXkzanCdeYsRYwyKEGIc8K90=:98ULnKL6RU6A86WWq2DkmQolsEw9vFjqn8ostiwK2Ks="
	salt, _ := base64.StdEncoding.DecodeString("xYkwilCzVttQlbSoZbZdkw==")
	if got, err := scramVerifier("pencil", salt, 4096); err != nil || got != pg {
		t.Errorf("scramVerifier = %q, %v; want %q", got, err, pg)
	}
	if !scramVerifies(pg, "pencil") || scramVerifies(pg, "pencil2") || scramVerifies("md5abc", "pencil") {
		t.Error("scramVerifies")
	}
	p := filepath.Join(t.TempDir(), "pgbouncer.auth")
	if changed, err := writePoolAuth(p, "pw1"); err != nil || !changed {
		t.Fatalf("first write: %v %v", changed, err)
	}
	b, _ := os.ReadFile(p)
	if !strings.HasPrefix(string(b), `"postgres" "SCRAM-SHA-256$4096:`) || strings.Contains(string(b), "pw1") {
		t.Errorf("auth file %q", b)
	}
	if changed, err := writePoolAuth(p, "pw1"); err != nil || changed {
		t.Errorf("same password: rewritten %v, %v", changed, err)
	}
	if changed, err := writePoolAuth(p, "pw2"); err != nil || !changed {
		t.Errorf("new password: rewritten %v, %v", changed, err)
	}
}

// A pooler's configuration: transaction mode on the server's address and
// the port 2000 above, the server's own socket behind it, TLS only in the
// TLS mode with the server's certificate.
func TestPoolerIni(t *testing.T) {
	e := New(Config{Dir: "/s"})
	plain := string(e.poolerIni(e.nodePooler(2)))
	for _, want := range []string{
		"\n* = host=/s/pg/pg2 port=25433\n", "\nlisten_addr = 127.0.0.1\n", "\nlisten_port = 27433\n",
		"\npool_mode = transaction\n", "\nauth_type = scram-sha-256\n", "\nauth_file = /s/pg/pg2/pgbouncer.auth\n",
		"\nadmin_users = postgres\n", "\nmax_client_conn = 2000\n", "\ndefault_pool_size = 20\n", "\nmax_db_connections = 40\n",
		"\nignore_startup_parameters = extra_float_digits\n",
	} {
		if !strings.Contains(plain, want) {
			t.Errorf("pg2's pgbouncer.ini lacks %q:\n%s", want, plain)
		}
	}
	if strings.Contains(plain, "tls") {
		t.Errorf("plain pgbouncer.ini mentions TLS:\n%s", plain)
	}
	e = New(Config{Dir: "/s", TLS: true})
	tls := string(e.poolerIni(e.memberPooler(4, 2)))
	for _, want := range []string{
		"\n* = host=/s/pg/pg4/m2 port=25535\n", "\nlisten_port = 27535\n", "\nclient_tls_sslmode = require\n",
		"\nclient_tls_cert_file = /s/tls/pg4-m2.crt\n", "\nclient_tls_key_file = /s/tls/pg4-m2.key\n",
	} {
		if !strings.Contains(tls, want) {
			t.Errorf("pg4-m2's pgbouncer.ini (TLS) lacks %q:\n%s", want, tls)
		}
	}
	// The member's Patroni callback: a shell script that waits for the
	// server's role and has the pooler reconnect.
	dir := t.TempDir()
	e = New(Config{Dir: dir, TLS: true})
	p := e.memberPooler(4, 2)
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := e.writeRoleChange(p); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p.roleChange())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-h " + dir + "/pg/pg4/m2 -p 25535 ", `"host=127.0.0.1 port=27535 user=postgres dbname=pgbouncer sslmode=require" -c RECONNECT`, "head -n 1 " + dir + "/pg/password"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("pgbouncer-role-change lacks %q:\n%s", want, b)
		}
	}
	if out, err := exec.Command("sh", "-n", p.roleChange()).CombinedOutput(); err != nil {
		t.Errorf("sh -n pgbouncer-role-change: %v\n%s", err, out)
	}
	if fi, err := os.Stat(p.roleChange()); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("pgbouncer-role-change: %v %v, want mode 0755", fi, err)
	}
}

// pgBackRest's configuration: the repository in DIR/backup, a stanza per
// node, a group's listing every member; each server's archive_command
// pushes from its own data directory. pgBackRest itself reads the file
// without a warning (an unknown option is one).
func TestPGBackRestConf(t *testing.T) {
	e := New(Config{Dir: "/s", PGNodes: 3, HA: 2, HANodes: []int{3}})
	got := string(e.pgbackrestConf())
	_, body, _ := strings.Cut(got, "[global]\n")
	want := `repo1-path=/s/backup/repo
repo1-retention-full=2
log-path=/s/backup/log
lock-path=/s/backup/lock
spool-path=/s/backup/spool
start-fast=y
compress-type=lz4
log-level-console=warn
log-level-file=info
archive-async=n
process-max=2

[pg1]
pg1-path=/s/pg/pg1/data
pg1-port=25432
pg1-socket-path=/s/pg/pg1
pg1-user=postgres

[pg2]
pg1-path=/s/pg/pg2/data
pg1-port=25433
pg1-socket-path=/s/pg/pg2
pg1-user=postgres

[pg3]
pg1-path=/s/pg/pg3/m1/data
pg1-port=25434
pg1-socket-path=/s/pg/pg3/m1
pg1-user=postgres
pg2-path=/s/pg/pg3/m2/data
pg2-port=25534
pg2-socket-path=/s/pg/pg3/m2
pg2-user=postgres
`
	if body != want {
		t.Errorf("pgbackrest.conf:\n%s\nwant after [global]:\n%s", got, want)
	}
	if e.BackupConfig() != "/s/backup/pgbackrest.conf" || e.Stanza(3) != "pg3" {
		t.Errorf("BackupConfig %q, Stanza(3) %q", e.BackupConfig(), e.Stanza(3))
	}
	for _, c := range []struct{ conf, want string }{
		{string(e.shardvisorConf(2)), "\narchive_mode = on\narchive_command = '/usr/bin/pgbackrest --config=/s/backup/pgbackrest.conf --stanza=pg2 --pg1-path=/s/pg/pg2/data archive-push %p'\narchive_timeout = 60s\n"},
		{string(e.patroniYML(3, 2, "pw", "")), "\n    archive_mode: 'on'\n    archive_command: '/usr/bin/pgbackrest --config=/s/backup/pgbackrest.conf --stanza=pg3 --pg1-path=/s/pg/pg3/m2/data archive-push %p'\n    archive_timeout: 60s\n"},
		{string(e.patroniYML(3, 1, "pw", "")), "\n  post_init: \"/bin/sh -c '/usr/bin/pgbackrest --config=/s/backup/pgbackrest.conf --stanza=pg3 --log-level-console=error stanza-create || true' post_init\"\n"},
	} {
		if !strings.Contains(c.conf, c.want) {
			t.Errorf("lacks %q:\n%s", c.want, c.conf)
		}
	}
	cmd := e.PGBackRestCommand()
	if os.Geteuid() == 0 && !slices.Equal(cmd, []string{"/usr/sbin/runuser", "-u", "postgres", "--", "/usr/bin/pgbackrest"}) ||
		os.Geteuid() != 0 && !slices.Equal(cmd, []string{"/usr/bin/pgbackrest"}) {
		t.Errorf("PGBackRestCommand() = %q", cmd)
	}

	if _, err := os.Stat(pgbackrestBin); err != nil {
		t.Skipf("pgBackRest is not installed (%v): scripts/install-deps --servers", err)
	}
	conf := filepath.Join(t.TempDir(), "pgbackrest.conf")
	if err := os.WriteFile(conf, []byte(got), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(pgbackrestBin, "--config="+conf, "--log-level-file=off", "--stanza=pg3", "--output=json", "info").CombinedOutput()
	if err != nil || strings.Contains(string(out), "WARN") || !strings.Contains(string(out), `"name":"pg3"`) {
		t.Errorf("pgbackrest info on it: %v\n%s", err, out)
	}
}

// up skips stanza-create when the repository's stanza is of the node's
// database: archive.info's current system id and version are pg_control's.
func TestStanzaCurrent(t *testing.T) {
	dir := t.TempDir()
	e := New(Config{Dir: dir, PGNodes: 2})
	write := func(path string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	control := make([]byte, 8192)
	binary.NativeEndian.PutUint64(control, 7713887890007576267)
	write(filepath.Join(dir, "pg/pg1/data/PG_VERSION"), []byte("15\n"))
	write(filepath.Join(dir, "pg/pg1/data/global/pg_control"), control)
	if e.stanzaCurrent(1) {
		t.Error("current without an archive.info")
	}
	info := func(id string) []byte {
		return []byte("[backrest]\nbackrest-format=5\nbackrest-version=\"2.45\"\n\n[db]\ndb-id=2\ndb-system-id=" + id +
			"\ndb-version=\"15\"\n\n[db:history]\n1={\"db-id\":7713886731511367212,\"db-version\":\"15\"}\n2={\"db-id\":" + id +
			",\"db-version\":\"15\"}\n\n[backrest]\nbackrest-checksum=\"9d53261d63eb19c6483f6dcf6be27da8ab6e1a55\"\n")
	}
	write(filepath.Join(dir, "backup/repo/archive/pg1/archive.info"), info("7713887890007576267"))
	if !e.stanzaCurrent(1) {
		t.Error("not current with the same system id")
	}
	write(filepath.Join(dir, "backup/repo/archive/pg1/archive.info"), info("7713886731511367212"))
	if e.stanzaCurrent(1) {
		t.Error("current with another system id")
	}
	if e.stanzaCurrent(2) {
		t.Error("pg2, which has no data, current")
	}
}
