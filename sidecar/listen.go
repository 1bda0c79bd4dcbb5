package sidecar

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// Listen opens the sidecar's listener. addr is host:port or unix:PATH
// (unix:///PATH also works). A TCP address that is not loopback is refused
// unless allowPublic: the sidecar is meant to sit next to the app.
func Listen(addr string, allowPublic bool) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		p = strings.TrimPrefix(p, "//")
		if p == "" {
			return nil, errors.New("listen address unix: needs a path")
		}
		// A stale socket file from a crashed run would block the bind; a
		// live one still answers, so only remove one that refuses.
		if c, err := net.Dial("unix", p); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: another process is serving on that socket", addr)
		}
		_ = os.Remove(p)
		return net.Listen("unix", p)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: want host:port or unix:/path (%v)", addr, err)
	}
	if !allowPublic && !isLoopback(host) {
		return nil, fmt.Errorf("listen address %q is not loopback; the router API is unauthenticated, so binding it elsewhere needs --allow-public", addr)
	}
	return net.Listen("tcp", addr)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
