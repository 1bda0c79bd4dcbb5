package hosts

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
)

// The wire check: a capture read back as TCP streams. Each stream's start
// is classified by its first bytes, and every stream's bytes, reassembled
// in sequence order each way, are searched for secrets (a marker written
// into a row, a password, a seed). A TLS record or PostgreSQL's SSLRequest
// followed by one are the only starts a stream between hosts may have.

// Start is how a stream began.
type Start string

const (
	// StartTLS: the client's first bytes are a TLS handshake record.
	StartTLS Start = "tls"
	// StartPGSSL: PostgreSQL's SSLRequest, the server's 'S', then a TLS
	// handshake record.
	StartPGSSL Start = "pg-sslrequest-tls"
	// StartPGSSLOnly: PostgreSQL's SSLRequest and the server's answer,
	// then nothing more from the client (it gave up: a connect timeout):
	// no other byte crossed.
	StartPGSSLOnly Start = "pg-sslrequest-only"
	// StartEmpty: no byte either way: a port probe (connected, closed), or
	// a connect refused or unanswered (a server down, a host cut off).
	StartEmpty Start = "empty"
	// StartPlain: anything else, TLS records that stop being TLS records
	// (plaintext after a handshake), or data in a SYN; the wire check
	// fails on it.
	StartPlain Start = "plain"
	// StartUnseen: bytes of a stream whose SYN the capture did not see (it
	// began before the capture): it cannot be classified, and the wire
	// check fails on it too: start the capture before the servers.
	StartUnseen Start = "unseen"
)

// Stream is one TCP connection seen on the bridge.
type Stream struct {
	Client, Server netip.AddrPort
	Start          Start
	// Head is the client's first bytes (at most 16), for a report.
	Head []byte
	// Bytes each way.
	ClientBytes, ServerBytes int
	// Gaps: holes in the sequence a lost capture packet left.
	Gaps int
}

// Report is what Analyze found.
type Report struct {
	Packets int
	// Unparsed counts captured frames that are not Ethernet/IPv4/TCP (the
	// capture takes TCP only: IPv6, a VLAN tag, IP options cut short).
	// Their bytes are in the raw secret count, but no stream holds them:
	// the wire check must find none.
	Unparsed int
	Streams  []Stream
	// Found[name] is how many times secret name occurred: in the raw
	// capture (any packet) plus in the reassembled streams (a secret split
	// across two segments).
	Found map[string]int
}

// Count is how many streams started as s.
func (r *Report) Count(s Start) int {
	n := 0
	for _, st := range r.Streams {
		if st.Start == s {
			n++
		}
	}
	return n
}

// Bad are the streams that did not start with TLS (empty ones aside), or
// that have a hole.
func (r *Report) Bad() []Stream {
	var out []Stream
	for _, st := range r.Streams {
		// A hole in a stream (a packet the capture lost) leaves its bytes
		// unread: it is not proven clean.
		if st.Start == StartPlain || st.Start == StartUnseen || st.Gaps > 0 {
			out = append(out, st)
		}
	}
	return out
}

// ByPort is "client host -> server:port" counts, for the log, with names
// from names (address -> host name).
func (r *Report) ByPort(names map[string]string) []string {
	c := map[string]int{}
	for _, st := range r.Streams {
		name := func(a netip.Addr) string {
			if n, ok := names[a.String()]; ok {
				return n
			}
			return a.String()
		}
		c[fmt.Sprintf("%s -> %s:%d %s", name(st.Client.Addr()), name(st.Server.Addr()), st.Server.Port(), st.Start)]++
	}
	out := make([]string, 0, len(c))
	for k, v := range c {
		out = append(out, fmt.Sprintf("%4d  %s", v, k))
	}
	sort.Strings(out)
	return out
}

var sslRequest = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}

// isTLSRecord: a handshake record (22) of TLS 1.0-1.3's record versions.
func isTLSRecord(b []byte) bool {
	return len(b) >= 3 && b[0] == 0x16 && b[1] == 0x03 && b[2] <= 0x04
}

// tlsFramed reports whether b is a run of TLS records from its start to
// its end (the last one may be cut short by the capture's end): content
// types 20-23, version 3.x, a length within the protocol's bound. A
// stream that switched to plaintext after its handshake breaks it.
func tlsFramed(b []byte) bool {
	for len(b) > 0 {
		if len(b) < 5 {
			return true // a header cut by the end of the capture
		}
		if b[0] < 20 || b[0] > 23 || b[1] != 3 || b[2] > 4 {
			return false
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if n > 1<<14+2048 {
			return false
		}
		if len(b) < 5+n {
			return true
		}
		b = b[5+n:]
	}
	return true
}

type segment struct {
	seq  uint32
	data []byte
}

type half struct {
	isn     uint32
	synned  bool
	synData bool // a SYN carried data (TCP Fast Open): never expected here
	segs    []segment
}

// bytes reassembles the half in sequence order from its ISN (none without
// its SYN: a refused connect's server half, a stream begun before the
// capture): overlaps
// (retransmissions) are read once; a hole is skipped and counted.
func (h *half) bytes() ([]byte, int) {
	if !h.synned {
		return nil, 0
	}
	sort.SliceStable(h.segs, func(i, j int) bool { return int32(h.segs[i].seq-h.segs[j].seq) < 0 })
	var out []byte
	next, gaps := h.isn+1, 0
	for _, s := range h.segs {
		d := int32(s.seq - next)
		switch {
		case d > 0:
			gaps++
			out = append(out, s.data...)
			next = s.seq + uint32(len(s.data))
		case int(-d) < len(s.data):
			out = append(out, s.data[-d:]...)
			next = s.seq + uint32(len(s.data))
		}
	}
	return out, gaps
}

type conn struct {
	client, server netip.AddrPort
	known          bool // the client's SYN was seen
	c2s, s2c       half
}

// Analyze reads a pcap file of Ethernet frames (tcpdump -w) and checks it
// for the secrets.
func Analyze(file string, secrets map[string][]byte) (*Report, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var gh [24]byte
	if _, err := io.ReadFull(r, gh[:]); err != nil {
		return nil, fmt.Errorf("hosts: %s: no pcap header: %w", file, err)
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(gh[:4]) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		return nil, fmt.Errorf("hosts: %s: not a pcap file", file)
	}
	if lt := bo.Uint32(gh[20:24]); lt != 1 {
		return nil, fmt.Errorf("hosts: %s: link type %d, want Ethernet (1)", file, lt)
	}
	rep := &Report{Found: map[string]int{}}
	conns := map[[2]netip.AddrPort]*conn{}
	var order []*conn
	var rh [16]byte
	for {
		if _, err := io.ReadFull(r, rh[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			return nil, err
		}
		pkt := make([]byte, bo.Uint32(rh[8:12]))
		if _, err := io.ReadFull(r, pkt); err != nil {
			break // the last packet, cut by a stop
		}
		src, dst, seq, flags, payload, ok := parseTCP(pkt)
		if ok && src.Addr() == sentinelAddr && dst.Addr() == sentinelAddr {
			continue // Stop's drain (drain.go), not the hosts'
		}
		rep.Packets++
		for name, s := range secrets {
			rep.Found[name] += bytes.Count(pkt, s)
		}
		if !ok {
			rep.Unparsed++
			continue
		}
		key := [2]netip.AddrPort{src, dst}
		if src.Compare(dst) > 0 {
			key = [2]netip.AddrPort{dst, src}
		}
		c := conns[key]
		const syn, ack = 0x02, 0x10
		if c == nil || (flags&syn != 0 && flags&ack == 0 && c.known && c.client == src && c.c2s.isn != seq) {
			// A new connection, or the same 4-tuple reused after a close.
			if c != nil {
				delete(conns, key)
			}
			c = &conn{client: src, server: dst}
			if flags&syn != 0 && flags&ack == 0 {
				c.known = true
			}
			conns[key] = c
			order = append(order, c)
		}
		h := &c.c2s
		if src != c.client {
			h = &c.s2c
		}
		if flags&syn != 0 {
			h.isn, h.synned = seq, true
			h.synData = h.synData || len(payload) > 0
			continue
		}
		if len(payload) > 0 {
			h.segs = append(h.segs, segment{seq: seq, data: slices.Clone(payload)})
		}
	}
	for _, c := range order {
		st := Stream{Client: c.client, Server: c.server}
		cb, g1 := c.c2s.bytes()
		sb, g2 := c.s2c.bytes()
		st.Gaps = g1 + g2
		st.ClientBytes, st.ServerBytes = len(cb), len(sb)
		st.Head = slices.Clone(cb[:min(16, len(cb))])
		st.Start = classify(c.known, cb, sb)
		if c.c2s.synData || c.s2c.synData {
			st.Start = StartPlain
		}
		for name, s := range secrets {
			// Counted in the raw packets already unless split: add only
			// the occurrences the packets did not hold whole.
			rep.Found[name] += max(0, bytes.Count(cb, s)+bytes.Count(sb, s)-countInSegs(c, s))
		}
		rep.Streams = append(rep.Streams, st)
	}
	return rep, nil
}

func countInSegs(c *conn, s []byte) int {
	n := 0
	for _, h := range []*half{&c.c2s, &c.s2c} {
		for _, g := range h.segs {
			n += bytes.Count(g.data, s)
		}
	}
	return n
}

func classify(seen bool, cb, sb []byte) Start {
	switch {
	case len(cb) == 0 && len(sb) == 0 && seen:
		return StartEmpty
	case !seen:
		return StartUnseen
	case isTLSRecord(cb) && tlsFramed(cb) && tlsFramed(sb):
		return StartTLS
	case bytes.HasPrefix(cb, sslRequest) && len(sb) > 0 && sb[0] == 'S' && isTLSRecord(cb[len(sslRequest):]) &&
		tlsFramed(cb[len(sslRequest):]) && tlsFramed(sb[1:]):
		return StartPGSSL
	case bytes.Equal(cb, sslRequest) && len(sb) <= 1:
		return StartPGSSLOnly
	}
	return StartPlain
}

// parseTCP reads an Ethernet II / IPv4 / TCP frame.
func parseTCP(p []byte) (src, dst netip.AddrPort, seq uint32, flags byte, payload []byte, ok bool) {
	if len(p) < 14 || binary.BigEndian.Uint16(p[12:14]) != 0x0800 {
		return
	}
	ip := p[14:]
	if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != 6 {
		return
	}
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if total > len(ip) || ihl < 20 || total < ihl+20 {
		return
	}
	sa, da := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	tcp := ip[ihl:total]
	off := int(tcp[12]>>4) * 4
	if off < 20 || off > len(tcp) {
		return
	}
	src = netip.AddrPortFrom(sa, binary.BigEndian.Uint16(tcp[0:2]))
	dst = netip.AddrPortFrom(da, binary.BigEndian.Uint16(tcp[2:4]))
	return src, dst, binary.BigEndian.Uint32(tcp[4:8]), tcp[13], tcp[off:], true
}

// String is a stream for a failure message.
func (s Stream) String() string {
	return fmt.Sprintf("%s -> %s %s (client sent %d B, server %d B, first bytes % x %q)", s.Client, s.Server, s.Start, s.ClientBytes, s.ServerBytes, s.Head, strings.ToValidUTF8(string(s.Head), "."))
}
