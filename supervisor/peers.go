package supervisor

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// The peer channel of fail-static (failstatic.go): every supervisor
// answers GET /peer/zk on its admin address with its ZooKeeper session
// state, and asks the others, from the member records it last read, when
// its own session is lost.
//
// Each answer is bound to one question: the asker sends its identity
// (pool/member) and a fresh random nonce; the answer names the asker, the
// answering member and the nonce, and with a shared peer secret
// (--peer-secret-file) carries X-Shardvisor-Peer-Mac, HMAC-SHA256 over a
// domain-separated, length-prefixed encoding of (asker, answerer, nonce,
// answer fields). The asker recomputes that MAC from what it expects (its
// own identity, the member it asked, its nonce), not from what the body
// claims, so an answer counts only if it comes from exactly the peer asked,
// for exactly this asker and this question. That refuses a stranger, a
// replay, a peer's answer relayed at another peer's address, an answer to
// another asker, and the asker's own answer reflected back to it (an
// adversarial run found that one: a host cut off from ZooKeeper counted its
// own "down here too" and went fail-static while its peers were connected).
// Without a secret the same identity checks apply but anyone able to
// answer on a peer's admin address can forge them (docs/supervisor.md,
// "Fail-static", says what that can and cannot cause).
//
// An answer also says how long the answerer's session has been connected
// (connected_ms), signed by a second MAC (X-Shardvisor-Peer-Mac-Age) over
// every field above and that one, so that a supervisor of this version
// still counts an older peer's answers and an older one still counts this
// one's. The asker uses connected_ms only when that MAC verifies (or when
// the fleet has no secret): stripping or forging it can only take away
// the shared-disruption wait (failstatic.go), never add it.

const (
	peerPath      = "/peer/zk"
	peerMACHeader = "X-Shardvisor-Peer-Mac"
	// peerAgeMACHeader signs the answer with connected_ms.
	peerAgeMACHeader = "X-Shardvisor-Peer-Mac-Age"
	// peerProto is the version of the question and answer. Version 1 (no
	// "v", MAC over the body, not bound to the asker or the answerer) is
	// refused both ways: a mixed fleet counts fewer answers, so its hosts
	// leave service rather than go fail-static (docs/supervisor.md).
	peerProto = 2
	// peerDomain separates this MAC from any other use of the secret.
	peerDomain = "shardvisor peer/zk answer v2\x00"
	// peerAgeDomain separates the MAC that covers connected_ms.
	peerAgeDomain = "shardvisor peer/zk answer v2 connected_ms\x00"
	// DefaultPeerRefresh is how often the member records are re-read for
	// the peer list (with jitter: a fleet must not list in step). A peer
	// that joined since is not asked; one that left answers nothing and
	// counts as not answering.
	DefaultPeerRefresh = 30 * time.Second
)

// peerID is a supervisor's identity: its pool and member name.
type peerID struct{ Pool, Member string }

func (id peerID) String() string { return id.Pool + "/" + id.Member }

// peerAnswer is the body of GET /peer/zk.
type peerAnswer struct {
	V           int    `json:"v"`
	AskerPool   string `json:"asker_pool"`
	AskerMember string `json:"asker_member"`
	Pool        string `json:"pool"`
	Member      string `json:"member"`
	Nonce       string `json:"nonce"`
	ZK          string `json:"zk"`
	Connected   bool   `json:"connected"`
	Mode        string `json:"mode"`
	// ConnectedMS is how long the answerer's session has been connected
	// without a break, in milliseconds (absent from older supervisors).
	ConnectedMS *int64 `json:"connected_ms,omitempty"`
}

func (a *peerAnswer) asker() peerID    { return peerID{a.AskerPool, a.AskerMember} }
func (a *peerAnswer) answerer() peerID { return peerID{a.Pool, a.Member} }

// peerQuestion is what the asker expects the answer to be bound to.
type peerQuestion struct {
	asker peerID // this supervisor
	peer  peerID // the member asked, from the peer list
	nonce string // fresh, 32 hex digits
}

// peerMAC signs an answer: HMAC-SHA256 under the secret over the domain
// tag, then each of asker pool, asker member, answerer pool, answerer
// member, nonce, zk, mode as a 4-byte big-endian length and its bytes, then
// connected as one byte. Length prefixes make the encoding unambiguous
// (no field can run into the next).
func peerMAC(secret []byte, q peerQuestion, zk string, connected bool, mode string) []byte {
	return peerMACWith(secret, peerDomain, q, zk, connected, mode, nil)
}

// peerAgeMAC is peerMAC under its own domain tag with connected_ms
// appended as 8 bytes big-endian.
func peerAgeMAC(secret []byte, q peerQuestion, zk string, connected bool, mode string, connectedMS int64) []byte {
	return peerMACWith(secret, peerAgeDomain, q, zk, connected, mode, &connectedMS)
}

func peerMACWith(secret []byte, domain string, q peerQuestion, zk string, connected bool, mode string, connectedMS *int64) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(domain))
	var n [4]byte
	for _, f := range []string{q.asker.Pool, q.asker.Member, q.peer.Pool, q.peer.Member, q.nonce, zk, mode} {
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	if connected {
		h.Write([]byte{1})
	} else {
		h.Write([]byte{0})
	}
	if connectedMS != nil {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(*connectedMS))
		h.Write(b[:])
	}
	return h.Sum(nil)
}

type peer struct {
	id    peerID
	admin string
}

type peerSet struct {
	mu    sync.Mutex
	peers []peer
	at    time.Time
}

func (p *peerSet) get() []peer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]peer(nil), p.peers...)
}

// refreshPeers re-reads every pool's member records while connected: at
// 1 s, 2 s, 4 s... after the start, then every PeerRefresh, so that
// supervisors started together know each other within seconds (one that
// knew no peer at an outage would leave service).
func (s *Supervisor) refreshPeers(ctx context.Context) {
	next := time.Duration(0)
	early := time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
		next = time.Second
		if s.opts.Session.State() != zksession.StateConnected {
			continue
		}
		peers, err := s.listPeers(ctx)
		if err != nil {
			s.log.Warn("listing the peers for fail-static failed; keeping the last list", zap.Error(err))
			continue
		}
		s.peers.mu.Lock()
		s.peers.peers, s.peers.at = peers, time.Now()
		s.peers.mu.Unlock()
		every := s.opts.PeerRefresh
		if early < every {
			every, early = early, 2*early
		}
		next = every + time.Duration(mrand.Int64N(int64(every/5)+1))
	}
}

func (s *Supervisor) listPeers(ctx context.Context) ([]peer, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pools, err := topo.ListPools(ctx, s.opts.Session, s.opts.Paths)
	if err != nil {
		return nil, err
	}
	self := s.AdminAddr()
	var out []peer
	for _, pool := range pools {
		ents, err := topo.ListPoolMembers(ctx, s.opts.Session, s.opts.Paths, pool)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if e.Err != nil || e.Rec.Admin == "" || e.Rec.Admin == self || (pool == s.opts.Pool && e.Name == s.opts.Member) {
				continue
			}
			out = append(out, peer{id: peerID{pool, e.Name}, admin: e.Rec.Admin})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id.String() < out[j].id.String() })
	return out, nil
}

// checkPeers asks every known peer at once, each bounded by PeerTimeout.
func (s *Supervisor) checkPeers(ctx context.Context) peerVerdict {
	ss := s.opts.Session
	// Read before asking: each answer's age is then compared with a
	// silence no longer than ours was when the peer answered.
	silent := ss.SinceOK()
	v := askPeers(ctx, s.peerClient, s.self(), s.AdminAddr(), s.peers.get(), s.opts.PeerSecret)
	timeout := ss.SessionTimeout()
	v.grace = timeout * 2 / 3
	v.waitOwn = sharedWait(v, silent, ss.SinceOK(), timeout)
	return v
}

// sharedWait is how long a host whose peers do not confirm an outage may
// still wait for its own session. Only if every connected peer reconnected
// after this host's last answer from ZooKeeper: those peers lost it too
// during this host's silence, a disruption shared with them (typically a
// leader election, which drops every client) from which a peer happened
// to reconnect first. The wait ends 5/6 of the session timeout after that
// answer, the server keeping the session at least the whole timeout after
// its last request. A host cut off alone (a peer connected all along, or
// a peer whose age is unknown) gets none. silent is this host's silence
// when it asked, sinceOK its silence now.
func sharedWait(v peerVerdict, silent, sinceOK, timeout time.Duration) time.Duration {
	if v.outage() || len(v.connected) == 0 || len(v.ages) != len(v.connected) {
		return 0
	}
	for _, age := range v.ages {
		if age >= silent {
			return 0
		}
	}
	return max(0, timeout*5/6-sinceOK)
}

func (s *Supervisor) self() peerID { return peerID{s.opts.Pool, s.opts.Member} }

// askPeers asks peers at once as self, whose admin address is selfAdmin.
// A peer list entry naming this supervisor (by identity or admin address)
// is known but never asked: a host must not vote for itself.
// peerHTTP is how the peers are asked: the client, and "https://" when
// the fleet's admin endpoints are TLS (Options.AdminTLS), else "http://".
// (The scheme cannot be read off the client: net/http fills in a
// transport's TLS configuration on first use.)
type peerHTTP struct {
	c      *http.Client
	scheme string
}

func askPeers(ctx context.Context, c peerHTTP, self peerID, selfAdmin string, peers []peer, secret []byte) peerVerdict {
	v := peerVerdict{known: len(peers)}
	type res struct {
		p   peer
		a   *peerAnswer
		err error
	}
	ch := make(chan res, len(peers))
	ctx, cancel := context.WithTimeout(ctx, PeerTimeout)
	defer cancel()
	for _, p := range peers {
		go func() {
			if p.id == self || (selfAdmin != "" && p.admin == selfAdmin) {
				ch <- res{p, nil, fmt.Errorf("the peer list names this supervisor itself (%s at %s): not asked", p.id, p.admin)}
				return
			}
			a, err := askPeer(ctx, c, p.admin, self, p.id, secret)
			ch <- res{p, a, err}
		}()
	}
	for range peers {
		r := <-ch
		switch {
		case r.err != nil:
			if len(v.errs) < 5 {
				v.errs = append(v.errs, r.p.id.String()+": "+r.err.Error())
			}
		default:
			v.answered++
			if r.a.Connected {
				v.connected = append(v.connected, r.p.id.String())
				if r.a.ConnectedMS != nil {
					v.ages = append(v.ages, time.Duration(*r.a.ConnectedMS)*time.Millisecond)
				}
			}
		}
	}
	sort.Strings(v.connected)
	return v
}

// askPeer asks the peer want at admin, as self, and checks its answer.
func askPeer(ctx context.Context, c peerHTTP, admin string, self, want peerID, secret []byte) (*peerAnswer, error) {
	nb := make([]byte, 16)
	if _, err := rand.Read(nb); err != nil {
		return nil, err
	}
	q := peerQuestion{asker: self, peer: want, nonce: hex.EncodeToString(nb)}
	query := url.Values{"v": {strconv.Itoa(peerProto)}, "nonce": {q.nonce}, "asker_pool": {self.Pool}, "asker_member": {self.Member}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.scheme+admin+peerPath+"?"+query.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d: %s", peerPath, resp.StatusCode, strings.TrimSpace(string(body[:min(len(body), 200)])))
	}
	return verifyPeerAnswer(body, resp.Header.Get(peerMACHeader), resp.Header.Get(peerAgeMACHeader), q, secret)
}

// verifyPeerAnswer decodes an answer and checks that it is bound to q: in
// this protocol version, from q.peer (never from q.asker itself), for
// q.asker and q.nonce, and, with a secret, signed over exactly that.
// connected_ms is kept only if ageMAC signs it too (with a secret).
func verifyPeerAnswer(body []byte, mac, ageMAC string, q peerQuestion, secret []byte) (*peerAnswer, error) {
	var a peerAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("answer: %v", err)
	}
	switch {
	case a.V != peerProto:
		return nil, fmt.Errorf("answer in peer protocol version %d, not %d (a supervisor older than this one?): not counted", a.V, peerProto)
	case a.answerer() == q.asker:
		return nil, fmt.Errorf("answer from this supervisor itself (%s), reflected back: not counted", q.asker)
	case a.answerer() != q.peer:
		return nil, fmt.Errorf("answer from %s, not from the peer asked (%s): not counted", a.answerer(), q.peer)
	case a.asker() != q.asker:
		return nil, fmt.Errorf("answer to another asker (%s): not counted", a.asker())
	case a.Nonce != q.nonce:
		return nil, fmt.Errorf("answer is for another request (nonce %q): not counted", a.Nonce)
	}
	if len(secret) > 0 {
		// From q, not from the body: the MAC must be over what we asked.
		got, err := hex.DecodeString(mac)
		if err != nil || !hmac.Equal(got, peerMAC(secret, q, a.ZK, a.Connected, a.Mode)) {
			return nil, fmt.Errorf("answer not signed with the peer secret for this question: not counted")
		}
		if a.ConnectedMS != nil {
			got, err := hex.DecodeString(ageMAC)
			if err != nil || !hmac.Equal(got, peerAgeMAC(secret, q, a.ZK, a.Connected, a.Mode, *a.ConnectedMS)) {
				a.ConnectedMS = nil // unsigned: as from an older peer
			}
		}
	}
	if a.ConnectedMS != nil && (*a.ConnectedMS < 0 || !a.Connected) {
		a.ConnectedMS = nil
	}
	return &a, nil
}

// servePeer answers GET /peer/zk?v=2&nonce=N&asker_pool=P&asker_member=M.
func (s *Supervisor) servePeer(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	if v := qv.Get("v"); v != strconv.Itoa(peerProto) {
		http.Error(w, fmt.Sprintf("peer protocol version %q: this supervisor answers only v=%d (the asker is older or newer; docs/supervisor.md, Fail-static)", v, peerProto), http.StatusBadRequest)
		return
	}
	nonce := qv.Get("nonce")
	if _, err := hex.DecodeString(nonce); err != nil || len(nonce) != 32 {
		http.Error(w, "nonce: want 32 hex digits", http.StatusBadRequest)
		return
	}
	asker := peerID{qv.Get("asker_pool"), qv.Get("asker_member")}
	if err := topo.ValidName("asker pool", asker.Pool); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := topo.ValidName("asker member", asker.Member); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	self := s.self()
	if asker == self {
		// Our own question came back to us (a peer list entry or a proxy
		// pointing here): answering would be a vote for ourselves.
		http.Error(w, "asked by "+self.String()+", which is this supervisor: it does not answer its own question", http.StatusConflict)
		return
	}
	a := peerAnswer{V: peerProto, AskerPool: asker.Pool, AskerMember: asker.Member, Pool: self.Pool, Member: self.Member, Nonce: nonce, ZK: "none"}
	if ss := s.opts.Session; ss != nil {
		st := ss.State()
		a.ZK, a.Connected = st.String(), st == zksession.StateConnected
		if a.Connected {
			ms := ss.ConnectedFor().Milliseconds()
			a.ConnectedMS = &ms
		}
	}
	s.snapMu.Lock()
	a.Mode = s.snap.State
	s.snapMu.Unlock()
	body, _ := json.Marshal(a)
	if len(s.opts.PeerSecret) > 0 {
		q := peerQuestion{asker: asker, peer: self, nonce: nonce}
		w.Header().Set(peerMACHeader, hex.EncodeToString(peerMAC(s.opts.PeerSecret, q, a.ZK, a.Connected, a.Mode)))
		if a.ConnectedMS != nil {
			w.Header().Set(peerAgeMACHeader, hex.EncodeToString(peerAgeMAC(s.opts.PeerSecret, q, a.ZK, a.Connected, a.Mode, *a.ConnectedMS)))
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(body)
}
