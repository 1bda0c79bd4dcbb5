package devenv

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-zookeeper/zk"
)

// The ZooKeeper ensemble: 3 servers of Debian's ZooKeeper 3.8 on one JVM
// each, every one with its zoo.cfg (templates/zoo.cfg.tmpl) and pid file
// under zk/zkI/.

// javaBin is $JAVA, /usr/bin/java, or java on PATH.
func javaBin() string {
	if j := os.Getenv("JAVA"); j != "" {
		return j
	}
	if _, err := os.Stat("/usr/bin/java"); err == nil {
		return "/usr/bin/java"
	}
	if p, err := exec.LookPath("java"); err == nil {
		return p
	}
	return "/usr/bin/java"
}

// zkPid is server i's pid if it runs (the pid file's process is the JVM of
// this zoo.cfg), else 0.
func (e *Env) zkPid(i int) int {
	dir := e.ZKDir(i)
	pid := readPid(filepath.Join(dir, "zk.pid"))
	if pid == 0 || !Alive(pid, "QuorumPeerMain "+filepath.Join(dir, "zoo.cfg")) {
		return 0
	}
	return pid
}

// ZKPid is server i's pid, 0 if it does not run.
func (e *Env) ZKPid(i int) int { return e.zkPid(i) }

// FourLetterWord sends a four-letter word (zoo.cfg whitelists srvr, mntr,
// stat, conf, ruok, cons and wchs) to addr and returns the answer, within
// timeout (a frozen server accepts the connection and answers nothing).
func FourLetterWord(addr, word string, timeout time.Duration) (string, error) {
	return fourLetterWith(net.DialTimeout, addr, word, timeout)
}

// ZKMode is server i's role: leader, follower, observer, not-serving (up,
// without a quorum) or down (not answering).
func (e *Env) ZKMode(i int) string {
	out, err := e.fourLetter(i, "srvr", 3*time.Second)
	if err != nil {
		return "down"
	}
	return modeOf(out)
}

// ZKModeAt is the Mode srvr reports at addr (leader, follower...), or
// not-serving when the server answers without one (no quorum).
func ZKModeAt(addr string, timeout time.Duration) (string, error) {
	out, err := FourLetterWord(addr, "srvr", timeout)
	if err != nil {
		return "", err
	}
	return modeOf(out), nil
}

func modeOf(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m)
		}
	}
	return "not-serving"
}

// zkConfigStale reports whether server i runs with another zoo.cfg than
// the one rendered now (started by an older devenv).
func (e *Env) zkConfigStale(i int) bool {
	b, err := os.ReadFile(filepath.Join(e.ZKDir(i), "zoo.cfg"))
	return err == nil && string(b) != string(e.zooCfg(i))
}

func (e *Env) zkWriteConfig(i int) error {
	dir := e.ZKDir(i)
	for _, d := range []string{"data", "datalog"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	files := map[string][]byte{
		"data/myid":        []byte(itoa(i) + "\n"),
		"zoo.cfg":          e.zooCfg(i),
		"log4j.properties": e.log4jProperties(i),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ensureSuper creates the ZooKeeper superuser's password: it lets test
// cleanup delete nodes whatever their ACLs.
func (e *Env) ensureSuper() (string, error) {
	f := e.SuperFile()
	if b, err := os.ReadFile(f); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		line, _, _ := strings.Cut(string(b), "\n")
		return line, nil
	}
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		return "", err
	}
	pw := randomPassword()
	if err := os.WriteFile(f, []byte(pw+"\n"), 0o644); err != nil {
		return "", err
	}
	return pw, os.Chmod(f, 0o644)
}

// randomPassword is 24 random letters and digits.
func randomPassword() string {
	const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return string(b)
}

// superDigest is base64(sha1("super:PASSWORD")), as ZooKeeper's
// DigestAuthenticationProvider.superDigest wants it.
func superDigest(pw string) string {
	h := sha1.Sum([]byte("super:" + pw))
	return base64.StdEncoding.EncodeToString(h[:])
}

// zkLaunch starts server i unless it runs, without waiting for it.
func (e *Env) zkLaunch(i int) error {
	dir := e.ZKDir(i)
	if pid := e.zkPid(i); pid != 0 {
		// A server left SIGSTOPped (a fault test that died before its
		// cleanup) is running but answers nothing: let it go on.
		if procState(pid) == 'T' {
			e.logf("zk%d: was stopped (SIGSTOP); continuing it", i)
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		return nil
	}
	_ = os.Remove(filepath.Join(dir, "zk.pid"))
	for _, p := range []int{e.ZKPort(i), e.zkQuorumPort(i), e.zkElectionPort(i)} {
		if !e.portFreed("zk"+itoa(i), p, 5*time.Second) {
			return errPortBusy(fmt.Sprintf("zk%d", i), p, "")
		}
	}
	if err := e.zkWriteConfig(i); err != nil {
		return err
	}
	pw, err := e.ensureSuper()
	if err != nil {
		return err
	}
	jars := append([]string{dir}, zkJars...)
	var tlsProps []string
	if e.c.TLS {
		if err := e.ensureTLS(); err != nil {
			return err
		}
		// zookeeper.jar's manifest lists netty's handler, buffer, common
		// and transport; TLS needs the codec and resolver too.
		jars = append(jars, zkNettyJars...)
		tlsProps = []string{"-Dzookeeper.X509AuthenticationProvider.superUser=" + devenvIdentity.DN()}
	}
	out, err := os.Create(filepath.Join(dir, "zookeeper.out"))
	if err != nil {
		return err
	}
	defer out.Close()
	jit := "-XX:TieredStopAtLevel=1" // C1 alone: see Config.ZKFullJIT
	if e.c.ZKFullJIT {
		jit = "-XX:+TieredCompilation"
	}
	cmd := exec.Command(javaBin(), "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", jit,
		"-XX:-UsePerfData", "-XX:+ExitOnOutOfMemoryError",
		"-Djava.net.preferIPv4Stack=true",
		"-Dzookeeper.log.dir="+dir,
		"-Dlog4j.configuration=file:"+filepath.Join(dir, "log4j.properties"),
		"-Dzookeeper.admin.enableServer=false",
		"-Dzookeeper.jmx.log4j.disable=true",
		"-Dzookeeper.fastleader.maxNotificationInterval=1000",
		"-Dzookeeper.DigestAuthenticationProvider.superDigest=super:"+superDigest(pw))
	cmd.Args = append(cmd.Args, tlsProps...)
	cmd.Args = append(cmd.Args, "-cp", strings.Join(jars, ":"),
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(dir, "zoo.cfg"))
	// ZooKeeper has machines of its own in production; here it shares two
	// cores with the db nodes, the web heads and the load, and a starved
	// JVM misses its quorum's 2 s timeouts, over TLS most of all (the
	// handshakes): a restart beside the demo's load took minutes. As root
	// it runs ahead of them (nice -5); nice execs java, so the pid stays.
	if nice, err := exec.LookPath("nice"); err == nil && os.Geteuid() == 0 {
		cmd.Path, cmd.Args = nice, append([]string{"nice", "-n", "-5"}, cmd.Args...)
	}
	pid, err := e.startOn("zk"+itoa(i), cmd, out)
	if err != nil {
		return fmt.Errorf("zk%d: %w", i, err)
	}
	if err := writePid(filepath.Join(dir, "zk.pid"), pid); err != nil {
		return err
	}
	e.logf("zk%d: started (pid %d, client port %d)", i, pid, e.ZKPort(i))
	return nil
}

func (e *Env) zkStop(i int) {
	if pid := e.zkPid(i); pid != 0 {
		e.stopPid(fmt.Sprintf("zk%d", i), pid, 10*time.Second)
		e.logf("zk%d: stopped (pid %d)", i, pid)
	}
	_ = os.Remove(filepath.Join(e.ZKDir(i), "zk.pid"))
}

func zkArg(i int) error {
	if i < 1 || i > ZKServers {
		return fmt.Errorf("no ZooKeeper server %d", i)
	}
	return nil
}

// ZKStop stops server i (SIGTERM, SIGKILL after 10 s).
func (e *Env) ZKStop(i int) error {
	if err := zkArg(i); err != nil {
		return err
	}
	return e.locked(func() error { e.zkStop(i); return nil })
}

// ZKKill SIGKILLs server i and returns once it is dead.
func (e *Env) ZKKill(i int) error {
	if err := zkArg(i); err != nil {
		return err
	}
	return e.locked(func() error {
		if pid := e.zkPid(i); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid)
			// Killed means its ports are free for the next start.
			e.portFreed("zk"+itoa(i), e.ZKPort(i), 5*time.Second)
			e.logf("zk%d: killed (pid %d)", i, pid)
		}
		_ = os.Remove(filepath.Join(e.ZKDir(i), "zk.pid"))
		return nil
	})
}

// ZKFreeze stops server i with SIGSTOP: its process and sockets stay and it
// answers nothing (a hung JVM, a paused VM) until ZKThaw or the next up.
func (e *Env) ZKFreeze(i int) error { return e.zkSignal(i, syscall.SIGSTOP, "frozen (SIGSTOP)") }

// ZKThaw continues server i after ZKFreeze (SIGCONT).
func (e *Env) ZKThaw(i int) error { return e.zkSignal(i, syscall.SIGCONT, "thawed (SIGCONT)") }

func (e *Env) zkSignal(i int, sig syscall.Signal, what string) error {
	if err := zkArg(i); err != nil {
		return err
	}
	pid := e.zkPid(i)
	if pid == 0 {
		return fmt.Errorf("zk%d is not running", i)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("zk%d (pid %d): %w", i, pid, err)
	}
	// Frozen means frozen when this returns: wait until every thread
	// stopped (CI run on stop 46 saw a queued SIGSTOP's JVM still answer
	// srvr as leader).
	if sig == syscall.SIGSTOP && !WaitStopped(pid, 5*time.Second) {
		return fmt.Errorf("zk%d (pid %d): not stopped 5 s after SIGSTOP", i, pid)
	}
	e.logf("zk%d: %s (pid %d)", i, what, pid)
	return nil
}

// ZKStart starts server i if it does not run and returns once it listens.
// When a quorum can exist (another server runs, not frozen) it also waits,
// without holding the environment, until this one serves as follower or
// leader; alone it cannot, so it does not wait for that.
func (e *Env) ZKStart(i int) error {
	if err := zkArg(i); err != nil {
		return err
	}
	if err := ensureInstalled(false); err != nil {
		return err
	}
	unlock, err := e.lock()
	if err != nil {
		return err
	}
	err = e.zkLaunch(i)
	if err == nil {
		// Running is the launched pid existing, not its command line
		// matching: java's launcher may exec itself again, and nice execs
		// java, and in between the command line reads empty (a start
		// was reported "process exited" with nothing in its log).
		pid := readPid(filepath.Join(e.ZKDir(i), "zk.pid"))
		err = e.waitListening(fmt.Sprintf("zk%d", i), e.ZKPort(i), func() bool { return Alive(pid, "") }, e.zkLog(i))
	}
	unlock()
	if err != nil {
		return err
	}
	others := 0
	for j := 1; j <= ZKServers; j++ {
		if pid := e.zkPid(j); j != i && pid != 0 && procState(pid) != 'T' {
			others++
		}
	}
	if others+1 < ZKServers/2+1 {
		e.logf("zk%d: listening; it serves once a quorum (%d servers) runs", i, ZKServers/2+1)
		return nil
	}
	deadline := time.Now().Add(e.c.Timeout)
	for {
		if e.zkPid(i) == 0 {
			return withLogs(fmt.Errorf("zk%d: process exited", i), e.zkLog(i))
		}
		switch mode := e.ZKMode(i); mode {
		case "leader", "follower":
			e.logf("zk%d: %s", i, mode)
			return nil
		default:
			if time.Now().After(deadline) {
				return withLogs(fmt.Errorf("zk%d: not serving after %s (mode: %s)", i, e.c.Timeout, mode), e.zkLog(i))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitListening waits until port accepts connections, failing at once if
// the process is gone (running reports it).
func (e *Env) waitListening(name string, port int, running func() bool, log string) error {
	deadline := time.Now().Add(e.c.Timeout)
	for !e.portBusy(name, port) {
		if !running() {
			return withLogs(fmt.Errorf("%s: process exited", name), log)
		}
		if time.Now().After(deadline) {
			return withLogs(fmt.Errorf("%s: not listening on port %d after %s", name, port, e.c.Timeout), log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// zkConn is a client of the ensemble for devenv's own reads and deletes
// (Patroni's state), without go-zookeeper's log lines.
func (e *Env) zkConn() (*zk.Conn, error) {
	dial, err := e.zkDial()
	if err != nil {
		return nil, err
	}
	c, _, err := zk.Connect(strings.Split(e.ZKConnect(), ","), 10*time.Second, zk.WithLogger(quiet{}), zk.WithDialer(dial))
	return c, err
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
