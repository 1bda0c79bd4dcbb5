package hosts

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// A capture's drain. tcpdump stopped by SIGINT leaves unwritten whatever
// the kernel had queued for it: on two busy cores that was the last 7 of
// 43 packets (a whole connection missing from the report). So before the
// signal, Stop writes a sentinel frame onto the bridge from the sandbox
// and waits until tcpdump has written it: the socket's queue is in order,
// so every packet before the sentinel is in the file too.

// sentinelAddr is the sentinel's source and destination: TEST-NET-1, never
// a host's (Subnet), and skipped by Analyze.
var sentinelAddr = netip.AddrFrom4([4]byte{192, 0, 2, 254})

const sentinelPort = 9 // discard

// sentinelFrame is an Ethernet/IPv4/TCP frame from sentinelAddr to itself
// carrying payload. Its destination MAC is one no host has, so every host
// drops it.
func sentinelFrame(payload []byte) []byte {
	f := make([]byte, 14+20+20+len(payload))
	copy(f[0:6], []byte{0x02, 0, 0, 0, 0, 0xfe})
	copy(f[6:12], []byte{0x02, 0, 0, 0, 0, 0xfd})
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(40+len(payload)))
	ip[8] = 1 // ttl
	ip[9] = 6 // tcp
	a := sentinelAddr.As4()
	copy(ip[12:16], a[:])
	copy(ip[16:20], a[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:12], ^uint16(sum))
	tcp := f[34:54]
	binary.BigEndian.PutUint16(tcp[0:2], sentinelPort)
	binary.BigEndian.PutUint16(tcp[2:4], sentinelPort)
	tcp[12] = 5 << 4
	tcp[13] = 0x18 // PSH|ACK
	copy(f[54:], payload)
	return f
}

// drain writes a sentinel onto the bridge and waits (up to wait) until the
// capture file holds it.
func (c *Capture) drain(wait time.Duration) error {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	payload := []byte("hosts-capture-drain-" + hex.EncodeToString(nonce))
	if err := c.net.inSandbox(func() error {
		ifi, err := net.InterfaceByName("br0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, sentinelFrame(payload), 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6, Addr: [8]byte{0x02, 0, 0, 0, 0, 0xfe}})
	}); err != nil {
		return fmt.Errorf("hosts: capture drain: %w", err)
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(c.File)
		if err == nil && bytes.Contains(b, payload) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hosts: capture drain: tcpdump did not write the sentinel within %s", wait)
		}
	}
}

// inSandbox runs fn on a thread of its own inside the sandbox namespace
// (the bridge's); the thread is never given back, as in Host.Do.
func (n *Net) inSandbox(fn func() error) error {
	f, err := os.Open(filepath.Join("/run/netns", n.sandbox()))
	if err != nil {
		return err
	}
	defer f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("hosts: enter the sandbox: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
