package supervisor

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"sort"
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
// Authentication: with a shared peer secret (--peer-secret-file) every
// answer carries X-Shardvisor-Peer-Mac, HMAC-SHA256 of the body under the
// secret, and the body echoes the asker's random nonce; an answer without
// a valid MAC or with another nonce is not counted, so neither a stranger
// nor a replayed answer can vote. Without a secret, answers are taken as
// they come: anyone able to answer on a peer's admin address can then
// keep a cut-off host serving with its last map (docs/supervisor.md,
// "Fail-static", says what that can and cannot cause).

const (
	peerPath      = "/peer/zk"
	peerMACHeader = "X-Shardvisor-Peer-Mac"
	// DefaultPeerRefresh is how often the member records are re-read for
	// the peer list (with jitter: a fleet must not list in step). A peer
	// that joined since is not asked; one that left answers nothing and
	// counts as not answering.
	DefaultPeerRefresh = 30 * time.Second
)

// peerAnswer is the body of GET /peer/zk.
type peerAnswer struct {
	Member    string `json:"member"`
	Pool      string `json:"pool"`
	ZK        string `json:"zk"`
	Connected bool   `json:"connected"`
	Mode      string `json:"mode"`
	Nonce     string `json:"nonce"`
}

type peer struct {
	name  string // pool/member
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
			out = append(out, peer{name: pool + "/" + e.Name, admin: e.Rec.Admin})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// checkPeers asks every known peer at once, each bounded by PeerTimeout.
func (s *Supervisor) checkPeers(ctx context.Context) peerVerdict {
	peers := s.peers.get()
	v := peerVerdict{known: len(peers), grace: s.opts.Session.SessionTimeout() * 2 / 3}
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
			a, err := askPeer(ctx, s.peerClient, p.admin, s.opts.PeerSecret)
			ch <- res{p, a, err}
		}()
	}
	for range peers {
		r := <-ch
		switch {
		case r.err != nil:
			if len(v.errs) < 5 {
				v.errs = append(v.errs, r.p.name+": "+r.err.Error())
			}
		default:
			v.answered++
			if r.a.Connected {
				v.connected = append(v.connected, r.p.name)
			}
		}
	}
	sort.Strings(v.connected)
	return v
}

// askPeer asks one peer and checks its answer.
func askPeer(ctx context.Context, c *http.Client, admin string, secret []byte) (*peerAnswer, error) {
	nb := make([]byte, 16)
	if _, err := rand.Read(nb); err != nil {
		return nil, err
	}
	nonce := hex.EncodeToString(nb)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+peerPath+"?nonce="+nonce, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", peerPath, resp.StatusCode)
	}
	return verifyPeerAnswer(body, resp.Header.Get(peerMACHeader), nonce, secret)
}

// verifyPeerAnswer decodes an answer and checks that it is for this nonce
// and, with a secret, signed with it.
func verifyPeerAnswer(body []byte, mac, nonce string, secret []byte) (*peerAnswer, error) {
	if len(secret) > 0 {
		got, err := hex.DecodeString(mac)
		if err != nil || !hmac.Equal(got, peerMAC(secret, body)) {
			return nil, fmt.Errorf("answer not signed with the peer secret")
		}
	}
	var a peerAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("answer: %v", err)
	}
	if a.Nonce != nonce {
		return nil, fmt.Errorf("answer is for another request (nonce %q)", a.Nonce)
	}
	return &a, nil
}

func peerMAC(secret, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(body)
	return h.Sum(nil)
}

// servePeer answers GET /peer/zk.
func (s *Supervisor) servePeer(w http.ResponseWriter, r *http.Request) {
	nonce := r.URL.Query().Get("nonce")
	if len(nonce) != 32 {
		http.Error(w, "nonce: want 32 hex digits", http.StatusBadRequest)
		return
	}
	if _, err := hex.DecodeString(nonce); err != nil {
		http.Error(w, "nonce: want 32 hex digits", http.StatusBadRequest)
		return
	}
	a := peerAnswer{Member: s.opts.Member, Pool: s.opts.Pool, Nonce: nonce, ZK: "none"}
	if ss := s.opts.Session; ss != nil {
		st := ss.State()
		a.ZK, a.Connected = st.String(), st == zksession.StateConnected
	}
	s.snapMu.Lock()
	a.Mode = s.snap.State
	s.snapMu.Unlock()
	body, _ := json.Marshal(a)
	if len(s.opts.PeerSecret) > 0 {
		w.Header().Set(peerMACHeader, hex.EncodeToString(peerMAC(s.opts.PeerSecret, body)))
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
