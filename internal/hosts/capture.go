package hosts

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Capture is tcpdump on the sandbox's bridge: every packet between hosts,
// whole (snaplen 0), written to a pcap file. Loopback traffic inside a
// host never crosses the bridge and is not in it.
type Capture struct {
	File string
	net  *Net
	cmd  *exec.Cmd
	log  string
	once sync.Once
}

// Capture starts tcpdump on the bridge, writing TCP packets to file, and
// returns once it listens.
func (n *Net) Capture(file string) (*Capture, error) {
	// A capture starts a new file. One kept from a failed run belongs to
	// the tcpdump user (tcpdump drops to it), and in a sticky directory
	// such as /dev/shm fs.protected_regular refuses even root an O_CREAT
	// open of it ("Permission denied"): remove it first.
	if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("hosts: removing the previous capture %s: %w", file, err)
	}
	log := file + ".log"
	lf, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	// -U and --immediate-mode: each packet is written as it comes (a stop
	// loses nothing held in a buffer); -B: 256 MiB of kernel buffer; -n:
	// no name lookups (there is nothing to ask). Ahead of the servers it
	// watches (nice -10): starved on two busy cores, it lost 0.4% of the
	// packets to a full buffer. Give it a file on tmpfs for the same
	// reason.
	cmd := exec.Command("ip", "netns", "exec", n.sandbox(), "nice", "-n", "-10", "tcpdump", "-i", "br0", "-n", "-U", "--immediate-mode", "-B", "262144", "-s", "0", "-w", file, "tcp")
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Capture{File: file, net: n, cmd: cmd, log: log}
	// tcpdump says "listening on br0" once its socket is bound.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), "listening on") {
			return c, nil
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("hosts: tcpdump on %s did not start: %s", filepath.Base(file), strings.TrimSpace(string(b)))
		}
	}
}

// Stop ends the capture and returns what tcpdump said, including whether
// the kernel dropped packets. It first waits until tcpdump has written
// every packet sent before the call (drain.go), then sends SIGINT (tcpdump
// flushes and prints its counts). A drain that fails is said in the
// returned text and the error; the capture still stops.
func (c *Capture) Stop() (string, error) {
	var drainErr error
	c.once.Do(func() {
		drainErr = c.drain(10 * time.Second)
		_ = c.cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- c.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
	})
	b, err := os.ReadFile(c.log)
	out := strings.TrimSpace(string(b))
	if drainErr != nil {
		return out + "\n" + drainErr.Error(), drainErr
	}
	return out, err
}
