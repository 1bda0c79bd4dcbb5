package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// One live supervisor per member name in a pool (issue 24): the pool lock
// (lock.go) only catches a second supervisor on the same state directory.
// In ZooKeeper mode the member record pools/<pool>/members/<member> is an
// ephemeral node, owned by the session that created it; a supervisor
// claims it before it binds, spawns or publishes anything, and refuses to
// start while another live session owns it. It never overwrites or
// deletes a record it does not own.
//
// Two owners are not "another live supervisor":
//   - the old supervisor of this one's own upgrade (SIGUSR2, the same
//     --member): the record is taken over when the old one has drained
//     and removed it, as before (the publisher retries the create);
//   - this supervisor's own previous run on this host, which crashed: its
//     session lives on in the server until the session timeout. Its
//     record names this host and a pid that no longer runs (or one reused
//     by a process started after the record), or this very pid (a
//     container restarted as pid 1). The claim waits for the server to
//     expire that session, logging it, for at most twice this session's
//     timeout; a record still held then is a live supervisor's.

// ErrMemberTaken is the error Run returns when another live supervisor
// holds this supervisor's member record.
var ErrMemberTaken = errors.New("the member name is taken by another live supervisor of the pool")

// memberExpiryWait bounds the wait for a crashed predecessor's session,
// in session timeouts.
const memberExpiryWait = 2

// claimPoll is how often the claim looks again while it waits.
const claimPoll = 200 * time.Millisecond

// claimMember registers this supervisor's member record (ZooKeeper mode),
// waiting for a connected session first. stop: a stop was asked for
// meanwhile (Run returns at once); err wraps ErrMemberTaken when the name
// is taken.
func (s *Supervisor) claimMember(ctx context.Context) (stop bool, err error) {
	ss, paths, pool, member := s.opts.Session, s.opts.Paths, s.opts.Pool, s.opts.Member
	where := paths.PoolMember(pool, member)
	log := s.log.With(zap.String("member", member), zap.String("path", where))
	var waitingSince time.Time // waiting for a crashed predecessor's session
	failures := 0
	for {
		if ss.State() != zksession.StateConnected {
			if s.claimWait(ctx, claimPoll) {
				return true, nil
			}
			continue
		}
		rec := topo.PoolMember{Version: topo.PoolMemberVersion, Member: member, Host: s.host, PID: os.Getpid(), State: "starting",
			ZK: zksession.StateConnected.String(), Admin: s.AdminAddr(), StartedAt: s.startedAt.UTC(), UpdatedAt: time.Now().UTC()}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		reg, err := topo.RegisterPoolMember(cctx, ss, paths, pool, rec)
		var h *topo.PoolMemberHolder
		if errors.Is(err, zksession.ErrOwnedElsewhere) {
			h, err = topo.ReadPoolMemberHolder(cctx, ss, paths, pool, member)
			if errors.Is(err, zksession.ErrNoNode) {
				err = nil // gone in between: create it again at once
			}
		}
		cancel()
		switch {
		case reg != nil:
			s.memberReg = reg
			if !waitingSince.IsZero() {
				log.Info("the previous supervisor's member record expired; registered ours",
					zap.Duration("waited", time.Since(waitingSince).Round(time.Millisecond)))
			}
			return false, nil
		case err != nil:
			// A pool never set up, a suspended session: nothing can serve
			// without them either; say so now and then, and retry.
			if failures++; failures == 1 || failures%50 == 0 {
				log.Warn("registering the member record failed; retrying before anything starts", zap.Error(err))
			}
			if s.claimWait(ctx, time.Second) {
				return true, nil
			}
			continue
		case h == nil:
			continue
		}
		verdict, why := s.judgeHolder(h)
		switch verdict {
		case holderParent:
			log.Info("the member record is held by the supervisor this one takes over from (upgrade); it is taken over once that one has drained",
				zap.Int("old_pid", s.up.parent), zap.String("owner_session", sessionHex(h.Owner)))
			return false, nil
		case holderPredecessor:
			bound := memberExpiryWait * ss.SessionTimeout()
			if waitingSince.IsZero() {
				waitingSince = time.Now()
				log.Warn("the member record is still held by the session of a previous supervisor on this host, which is gone ("+why+
					"); waiting for ZooKeeper to expire that session before starting", zap.String("owner_session", sessionHex(h.Owner)),
					zap.Duration("at_most", bound))
			}
			if time.Since(waitingSince) < bound {
				if s.claimWait(ctx, claimPoll) {
					return true, nil
				}
				continue
			}
			why = fmt.Sprintf("%s, yet its session still holds the record after %s: it is live after all", why, bound.Round(time.Millisecond))
		}
		return false, fmt.Errorf("%w: member %q of pool %q (%s) is held by %s, owner of ZooKeeper session %s%s; "+
			"pick another --member for this supervisor, or stop that one first", ErrMemberTaken, member, pool, where,
			holderWords(h), sessionHex(h.Owner), whySuffix(why))
	}
}

type holderVerdict int

const (
	holderLive        holderVerdict = iota // another live supervisor: refuse
	holderParent                           // the old supervisor of this one's upgrade
	holderPredecessor                      // this host's crashed previous supervisor: wait for its session
)

// judgeHolder decides who holds the record, owned by another session than
// ours, and says why.
func (s *Supervisor) judgeHolder(h *topo.PoolMemberHolder) (holderVerdict, string) {
	r := h.Rec
	// The ACL's creator, unlike the record's host and pid, cannot be
	// forged: a record another host's identity made is never this host's
	// own, whatever it says.
	if me := s.identity(); h.Creator != "" && h.Creator != me {
		return holderLive, fmt.Sprintf("created by the x509 identity %s, not this host's (%s): if that host is not a supervisor of this pool, its certificate is misused; revoke it (docs/security.md)", h.Creator, me)
	}
	switch {
	case h.Owner == 0:
		return holderLive, "a persistent node, which no supervisor writes: delete it"
	case r == nil:
		return holderLive, "its record does not decode: " + h.Err.Error()
	case r.Host != s.host:
		return holderLive, ""
	case s.up.seq > 0 && r.PID == s.up.parent:
		return holderParent, ""
	case r.PID == os.Getpid():
		return holderPredecessor, "it recorded this process's own pid: a restarted container"
	case !runningSince(r.PID, r.StartedAt):
		return holderPredecessor, fmt.Sprintf("pid %d no longer runs it", r.PID)
	}
	return holderLive, ""
}

// identity is the x509 identity this supervisor's session proves, or "".
func (s *Supervisor) identity() string {
	if s.opts.Session == nil {
		return ""
	}
	return s.opts.Session.Identity()
}

// claimWait waits d before the claim looks again, as the loop would: it
// keeps /livez answering and the service manager's watchdog fed (the wait
// lasts up to twice the session timeout, longer than a WatchdogSec= may
// be), and ends the wait (true) on a stop request. Other events find no
// loop yet: signals other than stops are dropped.
func (s *Supervisor) claimWait(ctx context.Context, d time.Duration) bool {
	s.loopAt.Store(time.Now().UnixNano())
	s.pingWatchdog(time.Now())
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return true
		case <-t.C:
			s.pingWatchdog(time.Now())
			return false
		case ev := <-s.events:
			switch ev := ev.(type) {
			case evStop:
				return true
			case evSignal:
				if ev.sig == syscall.SIGTERM || ev.sig == syscall.SIGINT || ev.sig == syscall.SIGQUIT {
					return true
				}
				s.log.Info("signal ignored: not serving yet (registering the member record)", zap.Stringer("signal", ev.sig))
			case evUpgrade:
				s.log.Warn("upgrade refused: this supervisor is not serving yet (registering the member record)")
			}
		}
	}
}

// runningSince reports whether pid runs a process started no later than
// at (plus a second: the clock tick of /proc), that is, possibly the one
// that wrote a record at "at". A pid reused by a newer process does not.
func runningSince(pid int, at time.Time) bool {
	p, err := readProcStat(pid)
	if err != nil || !p.live() {
		return false
	}
	boot, err := bootTime()
	if err != nil || at.IsZero() {
		return true // cannot tell: assume it is the one
	}
	started := boot.Add(time.Duration(p.start) * time.Second / clockTicks)
	return !started.After(at.Add(time.Second))
}

// clockTicks is USER_HZ, the unit of /proc's start times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// bootTime is the system's boot time (btime in /proc/stat).
func bootTime() (time.Time, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, err
			}
			return time.Unix(n, 0), nil
		}
	}
	return time.Time{}, errors.New("no btime in /proc/stat")
}

func holderWords(h *topo.PoolMemberHolder) string {
	if h.Rec == nil {
		return "an unknown process"
	}
	return fmt.Sprintf("the supervisor pid %d on host %s (started %s)", h.Rec.PID, h.Rec.Host, h.Rec.StartedAt.Format(time.RFC3339))
}

func whySuffix(why string) string {
	if why == "" {
		return ""
	}
	return " (" + why + ")"
}

func sessionHex(id int64) string { return "0x" + strconv.FormatInt(id, 16) }

// memberTakenOver stops a supervisor whose member record another live
// session holds now: its own session expired while it was cut off, and a
// supervisor started under the same name claimed it (an orchestrator
// replacing a partitioned host). Serving on would make two live
// supervisors of one name, each overwriting the other's records; Run
// returns ErrMemberTaken once the workers are gone (there are none after a
// session loss). A service manager restarting it gets the same refusal
// from claimMember, with what to do.
func (s *Supervisor) memberTakenOver(err error) {
	taken := fmt.Errorf("%w: member %q of pool %q was claimed by another supervisor while this one's ZooKeeper session was away (%v); "+
		"stopping: pick another --member for one of them", ErrMemberTaken, s.opts.Member, s.opts.Pool, err)
	if s.takenOver.CompareAndSwap(nil, &taken) {
		s.log.Error("member name taken by another live supervisor; stopping", zap.Error(taken))
		s.Stop(false)
	}
}
