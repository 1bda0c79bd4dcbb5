package zksession

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// Dialer opens a connection to a server, as Config.Dial does: nil is
// plain TCP.
type Dialer = func(network, address string, timeout time.Duration) (net.Conn, error)

// FourLetter sends a ZooKeeper four-letter command (srvr, mntr, ...) to one
// server over plain TCP and returns its answer. The server must whitelist
// the command (4lw.commands.whitelist).
func FourLetter(ctx context.Context, addr, cmd string) (string, error) {
	return FourLetterVia(ctx, nil, addr, cmd)
}

// FourLetterVia is FourLetter through dial: a TLS-only ensemble answers
// four-letter words on its secure port, to a client with a certificate.
func FourLetterVia(ctx context.Context, dial Dialer, addr, cmd string) (string, error) {
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if dial == nil {
		dial = net.DialTimeout
	}
	conn, err := dial("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
	}
	if _, err := io.WriteString(conn, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(conn)
	if err != nil && len(b) == 0 {
		return "", err // over TLS the server may close without close_notify once it has answered
	}
	out := string(b)
	if strings.Contains(out, "is not executed because it is not in the whitelist") {
		return "", fmt.Errorf("%s: four-letter command %q is not whitelisted (4lw.commands.whitelist)", addr, cmd)
	}
	return out, nil
}

// ServerStatus is a server's answer to srvr.
type ServerStatus struct {
	Addr        string `json:"addr"`
	Mode        string `json:"mode"` // leader, follower, standalone, or "" when not serving
	Zxid        string `json:"zxid,omitempty"`
	Connections int    `json:"connections"`
	Latency     string `json:"latency,omitempty"` // min/avg/max ms
	Err         string `json:"error,omitempty"`
}

// Serving reports whether the server is part of a quorum that serves
// clients. (ruok would answer imok even without a quorum.)
func (s ServerStatus) Serving() bool {
	return s.Mode == "leader" || s.Mode == "follower" || s.Mode == "standalone"
}

// Srvr asks one server for its status, through dial (nil: plain TCP).
func Srvr(ctx context.Context, dial Dialer, addr string) ServerStatus {
	st := ServerStatus{Addr: addr}
	out, err := FourLetterVia(ctx, dial, addr, "srvr")
	if err != nil {
		st.Err = err.Error()
		return st
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Mode":
			st.Mode = v
		case "Zxid":
			st.Zxid = v
		case "Connections":
			fmt.Sscan(v, &st.Connections)
		case "Latency min/avg/max":
			st.Latency = v
		}
	}
	if st.Mode == "" {
		st.Err = strings.TrimSpace(out) // e.g. "This ZooKeeper instance is not currently serving requests"
	}
	return st
}

// EnsembleStatus is every server's srvr answer and whether they make a
// quorum that serves clients.
type EnsembleStatus struct {
	Servers []ServerStatus
	Serving int  // servers that answer as leader, follower or standalone
	Leaders int  // leaders and standalone servers among them
	Quorum  bool // a majority serves, under exactly one leader
}

// Ensemble asks every server of cs with srvr, one after the other,
// through dial (nil: plain TCP). A quorum needs more than half of the
// servers serving and exactly one leader: two leaders mean the connect
// string mixes ensembles.
func Ensemble(ctx context.Context, cs ConnectString, dial Dialer) EnsembleStatus {
	var e EnsembleStatus
	for _, addr := range cs.Servers {
		st := Srvr(ctx, dial, addr)
		e.Servers = append(e.Servers, st)
		if st.Serving() {
			e.Serving++
		}
		if st.Mode == "leader" || st.Mode == "standalone" {
			e.Leaders++
		}
	}
	e.Quorum = e.Serving > len(cs.Servers)/2 && e.Leaders == 1
	return e
}
