package supervisor

import (
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
)

// Fail-static: when its ZooKeeper session is lost, a supervisor first asks
// its peers (the supervisors it knew from the member records, over their
// admin HTTP, peers.go) whether they reach ZooKeeper.
//
//   - If a strict majority of the peers it knew answer, and none of them
//     has a connected session, ZooKeeper is down for everyone: no map or
//     config can change (only ZooKeeper changes them) and every db node's
//     fence still refuses a write for a bucket it does not own, so the pool
//     keeps serving with the last config and map (fail-static), says so on
//     /healthz, in metrics and logs, refuses config changes, and asks the
//     peers again every PeerRecheck. It resumes normally when its session
//     is back.
//   - If every connected peer reconnected only after this host's last
//     answer from ZooKeeper (each answer says how long its session has been
//     connected, peers.go), the peers lost ZooKeeper too during this
//     host's silence: a disruption they shared, typically a leader
//     election, from which a peer happened to reconnect first (the fleet's
//     reconnects are jittered). The host waits for its own session, still
//     serving, until 5/6 of the session timeout after its last answer
//     (sharedWait), and leaves service only if it is not back by then.
//   - Otherwise (a peer connected all along: this host is cut off; too few
//     answers; no peer known) it leaves service as before: workers killed,
//     sockets closed.
//   - Once fail-static, a later answer that no longer confirms the outage
//     (typically: the ensemble is back and a peer reconnected first) starts
//     a grace of 2/3 of the session timeout for this host's own session to
//     come back, the time any host is given before it counts as cut off;
//     only then does it leave service.
//
// The check adds at most PeerTimeout to the time an isolated host takes to
// leave the load balancer (⅔ of the session timeout + PeerTimeout); after
// a shared disruption, one whose session is not back leaves at 5/6 of the
// session timeout after its last answer, still within its session's life.
const (
	PeerTimeout = 750 * time.Millisecond
	PeerRecheck = 2 * time.Second
	// failStaticLoud is how often a fail-static supervisor says so again
	// (a warning: the state change itself was logged, and /healthz and
	// the gauge say it all along).
	failStaticLoud = 60 * time.Second
)

// peerVerdict is what the peers said.
type peerVerdict struct {
	grace     time.Duration   // fail-static: how long a cut-off verdict may wait for our own session
	waitOwn   time.Duration   // a disruption shared with the connected peers: how long to wait for our own session (sharedWait)
	ages      []time.Duration // how long each connected peer has been connected, where it said so (signed)
	known     int             // peers known from the last member list
	answered  int             // answers that count (authenticated, fresh)
	connected []string        // peers whose session is connected
	errs      []string        // peers that did not answer, and why (a few)
}

// outage reports whether the answers say ZooKeeper is down for everyone.
func (v peerVerdict) outage() bool {
	return v.known > 0 && 2*v.answered > v.known && len(v.connected) == 0
}

func (v peerVerdict) fields() []zap.Field {
	return []zap.Field{zap.Int("peers_known", v.known), zap.Int("peers_answered", v.answered),
		zap.Strings("peers_connected", v.connected), zap.Strings("peer_errors", v.errs)}
}

func (m *machine) beginPeerCheck(reason string, now time.Time) {
	m.mode = modeChecking
	m.sharedUntil = time.Time{}
	m.lastError = "zookeeper session lost: " + reason
	m.log.Warn("zookeeper session lost; asking the peers whether the whole ensemble is down before leaving service", zap.String("reason", reason))
	m.do(actCheckPeers{})
}

func (m *machine) onPeers(v peerVerdict, now time.Time) {
	switch m.mode {
	case modeChecking:
		if !v.outage() {
			if v.waitOwn > 0 { // sharedWait: never in an outage
				m.m.peerChecks.WithLabelValues("shared").Inc()
				m.sharedUntil = now.Add(v.waitOwn)
				m.lastError = "zookeeper session lost: the peers reconnected after this host's last answer; waiting for this host's own session"
				m.log.Warn("the connected peers reconnected to ZooKeeper only after this host's last answer (a disruption they shared, such as a leader election); serving on while this host's own session comes back",
					append(v.fields(), zap.Duration("wait", v.waitOwn))...)
				return
			}
			m.m.peerChecks.WithLabelValues("cut_off").Inc()
			m.log.Warn("the peers do not confirm a whole-ensemble outage: this host is cut off", v.fields()...)
			m.enterLost("cut off (" + v.summary() + ")")
			return
		}
		m.m.peerChecks.WithLabelValues("outage").Inc()
		m.mode = modeFailStatic
		m.cutOffSince = time.Time{}
		m.failStatic = &topo.FailStatic{Since: now.UTC(), Peers: v.answered}
		m.peerCheckAt = now.Add(PeerRecheck)
		m.loudAt = now.Add(failStaticLoud)
		m.m.failStatic.Set(1)
		m.m.failStaticEpisodes.Inc()
		m.lastError = "fail-static: ZooKeeper unreachable for the whole fleet"
		m.log.Error("FAIL-STATIC: ZooKeeper is down for the whole fleet; serving on with the last config and map, refusing config changes",
			append(v.fields(), zap.Int64("generation", m.good.id), zap.Int64("config_version", m.good.spec.cfgVersion), zap.Uint64("map_version", m.good.spec.mapVersion()))...)
		m.do(actNotify{"STATUS=fail-static: ZooKeeper unreachable for the whole fleet; serving the last config and map"})
	case modeFailStatic:
		if v.outage() {
			m.failStatic.Peers = v.answered
			m.peerCheckAt = now.Add(PeerRecheck)
			m.cutOffSince = time.Time{}
			return
		}
		first := m.cutOffSince.IsZero()
		if first {
			m.cutOffSince = now
		}
		if now.Sub(m.cutOffSince) < v.grace {
			// The ensemble is probably back and a peer reconnected
			// first: give our own session the time any host gets.
			m.peerCheckAt = now.Add(min(PeerRecheck, v.grace-now.Sub(m.cutOffSince)))
			if first { // not at every recheck of the grace
				m.log.Warn("fail-static: the peers no longer confirm the outage; waiting for this host's own session before leaving service",
					append(v.fields(), zap.Duration("grace_left", v.grace-now.Sub(m.cutOffSince)))...)
			}
			return
		}
		m.m.peerChecks.WithLabelValues("cut_off").Inc()
		m.log.Warn("fail-static ends: the peers no longer confirm a whole-ensemble outage (a peer reached ZooKeeper, or too few answer); leaving service", v.fields()...)
		m.endFailStatic(now)
		m.enterLost("cut off during fail-static (" + v.summary() + ")")
	}
}

func (v peerVerdict) summary() string {
	switch {
	case v.known == 0:
		return "no peer known"
	case len(v.connected) > 0:
		return "peer " + v.connected[0] + " is connected"
	}
	return "only " + strconv.Itoa(v.answered) + " of " + strconv.Itoa(v.known) + " peers answered"
}

// reconcileShared ends the wait of a shared disruption (onPeers) whose
// session did not come back in time: the host leaves service.
func (m *machine) reconcileShared(now time.Time) {
	if m.sharedUntil.IsZero() || now.Before(m.sharedUntil) {
		return
	}
	m.sharedUntil = time.Time{}
	m.m.peerChecks.WithLabelValues("cut_off").Inc()
	m.log.Warn("this host's session did not come back within 5/6 of the session timeout after its last answer, though its peers reconnected: leaving service")
	m.enterLost("cut off (the peers reconnected; this host did not within 5/6 of the session timeout)")
}

// reconcileFailStatic asks the peers again and repeats the warning.
func (m *machine) reconcileFailStatic(now time.Time) {
	if !now.Before(m.peerCheckAt) {
		m.peerCheckAt = now.Add(time.Hour) // until the answer comes
		m.do(actCheckPeers{})
	}
	if !now.Before(m.loudAt) {
		m.loudAt = now.Add(failStaticLoud)
		m.log.Warn("FAIL-STATIC continues: ZooKeeper still unreachable for the whole fleet; serving the last config and map",
			zap.Duration("for", now.Sub(m.failStatic.Since).Round(time.Second)), zap.Int("peers_agree", m.failStatic.Peers))
	}
}

// leaveFailStatic: the session is back while serving on (checking the
// peers or fail-static). Nothing was torn down, so no holddown: the
// watches deliver the current config and map, and any change since is
// applied as usual.
func (m *machine) leaveFailStatic(now time.Time) {
	was, shared := m.mode, !m.sharedUntil.IsZero()
	m.mode = modeRunning
	m.cutOffSince = time.Time{}
	m.sharedUntil = time.Time{}
	m.lastError = ""
	if was == modeFailStatic {
		m.endFailStatic(now)
		m.log.Info("zookeeper session back; fail-static ends, serving normally", zap.Duration("lasted", now.Sub(m.failStatic.Since).Round(time.Millisecond)))
		m.do(actNotify{"STATUS=serving"})
		return
	}
	if shared {
		m.log.Info("zookeeper session back after the disruption shared with the peers; serving normally")
		return
	}
	m.log.Info("zookeeper session back before the peers answered; serving normally")
}

func (m *machine) endFailStatic(now time.Time) {
	if m.failStatic != nil && m.failStatic.Until.IsZero() {
		fs := *m.failStatic
		fs.Until = now.UTC()
		m.failStatic = &fs
	}
	m.m.failStatic.Set(0)
}
