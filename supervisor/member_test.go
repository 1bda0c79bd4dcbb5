package supervisor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// Who holds a member record decides whether a supervisor refuses to
// start, waits for a crashed predecessor's session, or takes the record
// over from the old supervisor of its upgrade.
func TestJudgeMemberHolder(t *testing.T) {
	dead := exec.Command("/bin/true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec := func(host string, pid int, started time.Time) *topo.PoolMember {
		return &topo.PoolMember{Member: "m1", Host: host, PID: pid, StartedAt: started}
	}
	for _, tc := range []struct {
		name   string
		h      topo.PoolMemberHolder
		parent int
		want   holderVerdict
	}{
		{"a persistent node", topo.PoolMemberHolder{Rec: rec("h1", os.Getppid(), now), Owner: 0}, 0, holderLive},
		{"a record that does not decode", topo.PoolMemberHolder{Err: errors.New("bad"), Owner: 7}, 0, holderLive},
		{"another host", topo.PoolMemberHolder{Rec: rec("h2", dead.Process.Pid, now), Owner: 7}, 0, holderLive},
		{"a live supervisor here", topo.PoolMemberHolder{Rec: rec("h1", os.Getppid(), now), Owner: 7}, 0, holderLive},
		{"the old supervisor of this upgrade", topo.PoolMemberHolder{Rec: rec("h1", os.Getppid(), now), Owner: 7}, os.Getppid(), holderParent},
		{"a crashed one here", topo.PoolMemberHolder{Rec: rec("h1", dead.Process.Pid, now), Owner: 7}, 0, holderPredecessor},
		{"a crashed one with this very pid", topo.PoolMemberHolder{Rec: rec("h1", os.Getpid(), now), Owner: 7}, 0, holderPredecessor},
		{"another host's identity, posing as a crashed one here", topo.PoolMemberHolder{Rec: rec("h1", dead.Process.Pid, now), Owner: 7, Creator: "CN=web2,OU=webhead,O=shardvisor"}, 0, holderLive},
		{"its pid reused by a newer process", topo.PoolMemberHolder{Rec: rec("h1", os.Getppid(), time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)), Owner: 7}, 0, holderPredecessor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Supervisor{host: "h1"}
			if tc.parent != 0 {
				s.up.seq, s.up.parent = 1, tc.parent
			}
			if got, why := s.judgeHolder(&tc.h); got != tc.want {
				t.Fatalf("verdict %d (%s), want %d", got, why, tc.want)
			}
		})
	}
}

// A supervisor whose session expired while it was cut off, and whose name
// another supervisor claimed meanwhile (an orchestrator replacing a
// partitioned host), finds the member record owned by another live
// session. It used to overwrite that record (ZooKeeper checks no owner on
// a write) and serve on: two live supervisors of one name. Now it stops,
// Run returns ErrMemberTaken, and the other's record is untouched.
func TestMemberTakenWhileAwayStopsTheSupervisor(t *testing.T) {
	t.Parallel()
	e, h, _, _, addr := zkPool(t, map[string]string{"TW_TAG": "a"}, nil)
	p := e.paths.PoolMember("web", "m1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// What an expiry and another supervisor's claim leave behind: the
	// record is another live session's (the test's own).
	// The supervisor's live session re-creates a record deleted under it,
	// so the claim may lose that race: delete and claim again until the
	// claim lands first, as a real one does once the session expired.
	theirs, err := topo.Encode(topo.PoolMember{Version: topo.PoolMemberVersion, Member: "m1", Host: "elsewhere", PID: 1, State: "serving"})
	if err != nil {
		t.Fatal(err)
	}
	for try := 1; ; try++ {
		if err := e.s.Delete(ctx, p, zksession.AnyVersion); err != nil && !errors.Is(err, zksession.ErrNoNode) {
			t.Fatal(err)
		}
		_, err := e.s.CreateEphemeral(ctx, p, theirs, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, zksession.ErrOwnedElsewhere) || try == 50 {
			t.Fatalf("claiming the name (try %d): %v", try, err)
		}
	}
	h.sv.Signal(syscall.SIGTTIN) // a change for the publisher to write
	err = testenv.Receive(t, h.done, 30*time.Second, "the supervisor did not stop with its name taken")
	h.done <- nil // for the harness's cleanup
	if !errors.Is(err, ErrMemberTaken) {
		t.Fatalf("Run returned %v, want ErrMemberTaken", err)
	}
	b, st, err := e.s.Get(ctx, p)
	if err != nil || string(b) != string(theirs) || st.EphemeralOwner != e.s.SessionID() {
		t.Fatalf("the other supervisor's record: %s owner 0x%x (%v), want it untouched", b, st.EphemeralOwner, err)
	}
	if _, err := get(addr); err == nil {
		t.Fatalf("the stopped supervisor still serves %s", addr)
	}
}

// The publisher coalesces its writes, but not a member record that
// acknowledges a new map version: a mover waits for that one before each
// move's freeze. With a coalescing window of an hour, a status change
// waits the hour while a new map's acknowledgement is written at once.
func TestPublisherWritesMapAcknowledgementsAtOnce(t *testing.T) {
	t.Parallel()
	e := startZK(t)
	s := &Supervisor{opts: Options{Session: e.s, Paths: e.paths, Pool: "web"}, log: zap.NewNop()}
	p := newPublisher(s)
	p.coalesce = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); <-p.done }()
	go p.run(ctx)
	read := func() topo.PoolMember {
		list, err := topo.ListPoolMembers(ctx, e.s, e.paths, "web")
		if err != nil || len(list) != 1 || list[0].Rec == nil {
			return topo.PoolMember{}
		}
		return *list[0].Rec
	}
	rec := topo.PoolMember{Version: topo.PoolMemberVersion, Member: "m1", State: "serving", MapVersion: 1, Target: 2}
	p.setMember(rec)
	testenv.WaitFor(t, 10*time.Second, func() bool { return read().MapVersion == 1 }, "the first member record")
	rec.Target = 3 // no new map: waits out the window
	p.setMember(rec)
	rec.MapVersion, rec.Target = 2, 4 // a new map: written at once, with the rest
	p.setMember(rec)
	testenv.WaitFor(t, 10*time.Second, func() bool { return read().MapVersion == 2 }, "map version 2 acknowledged within the coalescing window")
	if got := read(); got.Target != 4 {
		t.Fatalf("the record written: %+v, want the newest (4 workers)", got)
	}
}
