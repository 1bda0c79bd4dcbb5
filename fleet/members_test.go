package fleet

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/faultproxy"
	"github.com/shardvisor/shardvisor/internal/testenv"
	"github.com/shardvisor/shardvisor/internal/zktest"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// eventually polls cond (a view's state, which follows ZooKeeper
// asynchronously) until it holds, failing after a generous bound.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// members lists the paths of stragglers, with their version or error.
func describeStragglers(ss []topo.Straggler) string {
	var out []string
	for _, s := range ss {
		if s.Error != "" {
			out = append(out, s.Member+"!"+s.Error)
		} else {
			out = append(out, fmt.Sprintf("%s@%d", s.Member, s.MapVersion))
		}
	}
	return strings.Join(out, " ")
}

// waitAsync runs Wait in the background; its result arrives on the channel.
type waitResult struct {
	behind []topo.Straggler
	err    error
}

func waitAsync(v *MemberView, ctx context.Context, version uint64, timeout time.Duration) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		b, err := v.Wait(ctx, version, timeout)
		ch <- waitResult{b, err}
	}()
	return ch
}

// notReturned fails the test if a background Wait has already returned.
func notReturned(t *testing.T, ch <-chan waitResult, why string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Wait returned (%s, %v) although %s", describeStragglers(r.behind), r.err, why)
	default:
	}
}

// zkCluster gives the test an in-memory ZooKeeper with a session on it
// (the records' logic needs no server; what only ZooKeeper does, ACLs and
// partitions, stays on the real ensemble); p are the paths of cluster c1
// under its root, ctx lasts a minute.
func zkCluster(t *testing.T) (ctx context.Context, z *zktest.MemoryTree, s *zksession.Session, p topo.Paths) {
	t.Helper()
	z, s = zktest.NewMemoryTree(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	p = topo.MustPaths(z.Root, "c1")
	// The cluster's member directories, as shardctl init makes them.
	for _, dir := range []string{p.Routers(), p.Pools()} {
		if err := s.CreateAll(ctx, dir); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, z, s, p
}

func routerRec(id string, v uint64) topo.RouterMember {
	return topo.RouterMember{Version: topo.RouterMemberVersion, ID: id, MapVersion: v}
}

func poolRec(id string, v uint64) topo.PoolMember {
	return topo.PoolMember{Version: topo.PoolMemberVersion, Member: id, State: "serving", MapVersion: v}
}

// The view follows members joining, leaving, updating and not decoding;
// Wait returns nil only once every live member has applied the version.
func TestMemberView(t *testing.T) {
	ctx, z, s, p := zkCluster(t)
	// The members are other processes: another session.
	ms := z.Session(t)
	// Members that leave count for the grace (TestMemberViewVanished);
	// here they are forgotten soon after.
	v := watchMembers(ctx, s, p, 10*time.Millisecond)
	defer v.Close()

	if b, err := v.Wait(ctx, 5, 5*time.Second); err != nil || b != nil {
		t.Fatalf("no members at all: %v %v", describeStragglers(b), err)
	}
	r1, err := topo.RegisterRouter(ctx, ms, p, routerRec("r1", 4))
	if err != nil {
		t.Fatal(err)
	}
	h1, err := topo.RegisterPoolMember(ctx, ms, p, "web", poolRec("h1", 4))
	if err != nil {
		t.Fatal(err)
	}
	// Both joined after the view started: Wait's listing finds them, and
	// when the time is up they are the stragglers, at their versions.
	b, err := v.Wait(ctx, 5, 3*time.Second) // generous: the listing itself must fit in the wait on a loaded machine
	want := p.PoolMember("web", "h1") + "@4 " + p.Router("r1") + "@4"
	if err != nil || describeStragglers(b) != want {
		t.Fatalf("stragglers %q (%v), want %q", describeStragglers(b), err, want)
	}

	bad := p.PoolMember("web", "bad")
	eb, err := ms.CreateEphemeral(ctx, bad, []byte("garbage"), nil)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the undecodable record listed with its error", func() bool {
		for _, st := range v.Behind(5) {
			if st.Member == bad && strings.Contains(st.Error, "pool member at "+bad) && strings.Contains(st.Error, "not JSON") {
				return true
			}
		}
		return false
	})
	if err := r1.Update(ctx, routerRec("r1", 5)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "r1 caught up", func() bool { return !strings.Contains(describeStragglers(v.Behind(5)), p.Router("r1")) })

	// The last stragglers catch up (h1) or go away (bad): Wait returns.
	done := waitAsync(v, ctx, 5, time.Minute)
	notReturned(t, done, "h1 and bad are behind")
	if err := h1.Update(ctx, poolRec("h1", 5)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "only bad left", func() bool { b := v.Behind(5); return len(b) == 1 && b[0].Member == bad })
	notReturned(t, done, "bad does not decode")
	if err := eb.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.behind != nil {
		t.Fatalf("after the last straggler left: %s %v", describeStragglers(r.behind), r.err)
	}

	// A member that joins at an old version during a wait (in a pool that
	// did not exist) is waited for. Until the view has it, r1 and h1 hold
	// the wait; the view learns of a1 through three watches in turn, so
	// the others catch up only once it has.
	done = waitAsync(v, ctx, 6, time.Minute)
	a1, err := topo.RegisterPoolMember(ctx, ms, p, "api", poolRec("a1", 5))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a1 known", func() bool {
		return strings.Contains(describeStragglers(v.Behind(6)), p.PoolMember("api", "a1")+"@5")
	})
	if err := r1.Update(ctx, routerRec("r1", 6)); err != nil {
		t.Fatal(err)
	}
	if err := h1.Update(ctx, poolRec("h1", 6)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "only a1 behind", func() bool { return describeStragglers(v.Behind(6)) == p.PoolMember("api", "a1")+"@5" })
	notReturned(t, done, "a1 joined at version 5")
	if err := a1.Update(ctx, poolRec("a1", 6)); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.err != nil || r.behind != nil {
		t.Fatalf("after a1 caught up: %s %v", describeStragglers(r.behind), r.err)
	}

	// Leaving: the record goes, and so does the member.
	if n := v.Members(); n != 3 {
		t.Fatalf("following %d members, want 3 (r1, h1, a1)", n)
	}
	if err := h1.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "h1 forgotten", func() bool { return v.Members() == 2 })
	// A whole pool going away takes its members with it.
	if err := a1.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ms.DeleteAll(ctx, p.Pool("api")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool api forgotten", func() bool { return v.Members() == 1 })
	if b := v.Behind(7); describeStragglers(b) != p.Router("r1")+"@6" {
		t.Fatalf("behind 7: %s", describeStragglers(b))
	}

	if kind := p.MemberKind(p.Router("r1")); kind != "router" {
		t.Fatalf("kind of a router: %s", kind)
	}
	if kind := p.MemberKind(p.PoolMember("web", "h1")); kind != "supervisor" {
		t.Fatalf("kind of a supervisor: %s", kind)
	}
	// Close ends a wait in progress (r1 holds it) with an error.
	done = waitAsync(v, ctx, 7, time.Hour)
	v.Close()
	if r := <-done; r.err == nil || !strings.Contains(r.err.Error(), "closed") {
		t.Fatalf("a Wait when its view closed: %s %v", describeStragglers(r.behind), r.err)
	}
	if _, err := v.Wait(ctx, 7, time.Second); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Wait on a closed view: %v", err)
	}
}

// Session loss: while the view's session is partitioned, Wait cannot know
// the members and says so; after it comes back, the view has caught up
// with everything that happened meanwhile (a member left, one joined, one
// updated).
func TestIntegrationMemberViewPartition(t *testing.T) {
	skipUnderRace(t)
	z := testenv.StartZK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := topo.MustPaths(z.Root, "c1")
	proxy, err := faultproxy.New(z.Servers[0])
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	s := zktest.Session(t, zksession.Config{Connect: proxy.Addr(), SessionTimeout: 2 * time.Second, OpTimeout: time.Second})
	ms := zktest.Session(t, zksession.Config{Connect: z.ConnectString})
	stay, err := topo.RegisterRouter(ctx, ms, p, routerRec("stay", 1))
	if err != nil {
		t.Fatal(err)
	}
	leave, err := topo.RegisterPoolMember(ctx, ms, p, "web", poolRec("leave", 1))
	if err != nil {
		t.Fatal(err)
	}
	v := WatchMembers(ctx, s, p)
	defer v.Close()
	if b, err := v.Wait(ctx, 1, 10*time.Second); err != nil || b != nil {
		t.Fatalf("before the partition: %s %v", describeStragglers(b), err)
	}

	sub := s.Subscribe()
	defer sub.Close()
	proxy.SetMode(faultproxy.Blackhole)
	for ch := range sub.C {
		if ch.To == zksession.StateLost {
			break
		}
	}
	if b, err := v.Wait(ctx, 2, 1500*time.Millisecond); err == nil || !strings.Contains(err.Error(), "members not known") {
		t.Fatalf("Wait while partitioned: %s %v, want an error saying the members are not known", describeStragglers(b), err)
	}
	if err := leave.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := stay.Update(ctx, routerRec("stay", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := topo.RegisterPoolMember(ctx, ms, p, "web", poolRec("joined", 1)); err != nil {
		t.Fatal(err)
	}
	proxy.SetMode(faultproxy.Pass)
	// The member that left is forgotten (else it would be behind at 1),
	// the one that joined is known, stay's update is seen.
	want := p.PoolMember("web", "joined") + "@1"
	eventually(t, "the view caught up after the partition", func() bool {
		return describeStragglers(v.Behind(2)) == want && v.Members() == 2
	})
	b, err := v.Wait(ctx, 2, 500*time.Millisecond)
	if err != nil || describeStragglers(b) != want {
		t.Fatalf("Wait after the partition: %q %v, want %q", describeStragglers(b), err, want)
	}
}

// pollMembers is how the mover waited before the view: every 20 ms, list
// and read every member record, until none is below version or the
// timeout passes.
func pollMembers(ctx context.Context, s *zksession.Session, p topo.Paths, version uint64, timeout time.Duration) (behind, polls int, err error) {
	deadline := time.Now().Add(timeout)
	for {
		polls++
		behind = 0
		routers, err := topo.ListRouters(ctx, s, p)
		if err != nil {
			return 0, polls, err
		}
		for _, r := range routers {
			if r.Err != nil || r.Rec.MapVersion < version {
				behind++
			}
		}
		pools, err := topo.ListPools(ctx, s, p)
		if err != nil {
			return 0, polls, err
		}
		for _, pool := range pools {
			ms, err := topo.ListPoolMembers(ctx, s, p, pool)
			if err != nil {
				return 0, polls, err
			}
			for _, m := range ms {
				if m.Err != nil || m.Rec.MapVersion < version {
					behind++
				}
			}
		}
		if behind == 0 || time.Now().After(deadline) {
			return behind, polls, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reads counts the read requests a session has sent.
func reads(s *zksession.Session) int64 {
	r := s.Requests()
	return r["get"] + r["children"] + r["watch"]
}

// How many ZooKeeper reads following N members costs per map version:
// 200 member records (100 routers, 2 pools of 50 supervisors), each
// updated once, a millisecond apart, to the new version, followed by the
// view (one session) and by the old 20 ms poll (another session). Then the
// same with one member that never catches up, for a 2 s member wait.
func TestMemberViewReads(t *testing.T) {
	_, z, s, p := zkCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Generous call bounds: the 200 members' writes and the old poll's
	// reads must not time out on a busy machine.
	ms := zktest.MemorySession(t, z.Server, zksession.Config{OpTimeout: 30 * time.Second})
	old := zktest.MemorySession(t, z.Server, zksession.Config{OpTimeout: 30 * time.Second})
	const routers, pools, perPool = 100, 2, 50
	const n = routers + pools*perPool
	type member struct {
		update func(uint64) error
	}
	var all []member
	for i := range routers {
		id := fmt.Sprintf("r%03d", i)
		reg, err := topo.RegisterRouter(ctx, ms, p, routerRec(id, 1))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, member{func(v uint64) error { return reg.Update(ctx, routerRec(id, v)) }})
	}
	for pl := range pools {
		for i := range perPool {
			id := fmt.Sprintf("h%03d", i)
			reg, err := topo.RegisterPoolMember(ctx, ms, p, fmt.Sprintf("pool%d", pl), poolRec(id, 1))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, member{func(v uint64) error { return reg.Update(ctx, poolRec(id, v)) }})
		}
	}
	// update moves the members to version, a millisecond apart, leaving
	// out the last skip of them.
	update := func(version uint64, skip int) {
		for _, m := range all[:len(all)-skip] {
			if err := m.update(version); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}

	v := WatchMembers(ctx, s, p)
	defer v.Close()
	before := reads(s)
	if b, err := v.Wait(ctx, 1, time.Minute); err != nil || b != nil {
		t.Fatalf("first wait: %s %v", describeStragglers(b), err)
	}
	first := reads(s) - before
	if v.Members() != n {
		t.Fatalf("the view follows %d members, want %d", v.Members(), n)
	}

	// measure moves the members to version (but the last skip), once
	// followed by the view's Wait and once by the old poll, each given
	// wait, and counts the reads of each. The view's count runs until it
	// has seen every update, also those after its wait ended.
	measure := func(version uint64, skip int, wait time.Duration) (view, poll int64, viewBehind []topo.Straggler, pollBehind, polls int) {
		before := reads(s)
		done := waitAsync(v, ctx, version, wait)
		update(version, skip)
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		eventually(t, "the view saw every update", func() bool { return len(v.Behind(version)) == skip })
		view, viewBehind = reads(s)-before, r.behind
		var wg sync.WaitGroup

		before = reads(old)
		var perr error
		wg.Add(1)
		go func() { defer wg.Done(); pollBehind, polls, perr = pollMembers(ctx, old, p, version+1, wait) }()
		update(version+1, skip)
		wg.Wait()
		if perr != nil {
			t.Fatal(perr)
		}
		return view, reads(old) - before, viewBehind, pollBehind, polls
	}

	view, poll, vb, pb, polls := measure(2, 0, time.Minute)
	if vb != nil || pb != 0 {
		t.Fatalf("all members updated, yet %s (view) and %d (poll) behind", describeStragglers(vb), pb)
	}
	t.Logf("%d members, each updated once: view %d reads (its first wait, listing and reading them all: %d); old 20 ms poll %d reads in %d polls", n, view, first, poll, polls)
	if view >= 2*n {
		t.Fatalf("the view read %d times for %d record changes", view, n)
	}
	if first > n+2+pools+n/10 {
		t.Fatalf("the first wait read %d times for %d members in %d pools", first, n, pools)
	}

	const memberWait = 2 * time.Second
	view, poll, vb, pb, polls = measure(4, 1, memberWait)
	// On a slow machine other updates may also come after the wait ends.
	if stuck := (topo.Straggler{Member: p.PoolMember("pool1", "h049"), MapVersion: 3}); !slices.Contains(vb, stuck) || pb < 1 {
		t.Fatalf("%s left behind, yet the view names %d stragglers without it (%.200s) and %d are behind for the poll", stuck.Member, len(vb), describeStragglers(vb), pb)
	}
	t.Logf("the view's wait ended with %d stragglers", len(vb))
	t.Logf("%d members, one never catching up, %s member wait: view %d reads; old 20 ms poll %d reads in %d polls", n, memberWait, view, poll, polls)
	if view >= 2*n {
		t.Fatalf("with a straggler the view read %d times for %d record changes", view, n-1)
	}
}

// A view whose session closes stops with it, Close or not.
func TestMemberViewEndsWithSession(t *testing.T) {
	ctx, z, _, p := zkCluster(t)
	s := z.Session(t)
	if _, err := topo.RegisterRouter(ctx, s, p, routerRec("r1", 1)); err != nil {
		t.Fatal(err)
	}
	v := WatchMembers(ctx, s, p)
	if b, err := v.Wait(ctx, 1, 10*time.Second); err != nil || b != nil {
		t.Fatalf("wait: %s %v", describeStragglers(b), err)
	}
	s.Close()
	stopped := make(chan struct{})
	go func() { v.wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the view's goroutines outlived its session")
	}
	if _, err := v.Wait(ctx, 2, time.Second); err == nil {
		t.Fatal("Wait on the view of a closed session succeeded")
	}
}

// putRecord writes a member record as a plain node, which nobody re-creates
// once deleted (an owner's zksession.Ephemeral would put it back).
func putRecord(t *testing.T, s *zksession.Session, at string, rec any) {
	t.Helper()
	data, err := topo.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	zktest.Put(t, s, at, string(data))
}

// A member record deleted by another session is not "nobody there": the
// member counts at its last version until its record reappears (then at
// its new version), or, if it never does, until the view's grace has
// passed; Wait then returns. A record never seen there does not count.
func TestMemberViewVanished(t *testing.T) {
	ctx, z, s, p := zkCluster(t)
	owner, other := z.Session(t), z.Session(t)
	long := watchMembers(ctx, s, p, time.Hour) // the grace never ends within the test
	defer long.Close()
	short := watchMembers(ctx, s, p, 50*time.Millisecond)
	defer short.Close()

	r1, h1 := p.Router("r1"), p.PoolMember("web", "h1")
	putRecord(t, owner, r1, routerRec("r1", 4))
	putRecord(t, owner, h1, poolRec("h1", 6))
	for _, v := range []*MemberView{long, short} {
		if b, err := v.Wait(ctx, 4, time.Minute); err != nil || b != nil {
			t.Fatalf("both at 4 or later: %s %v", describeStragglers(b), err)
		}
	}
	if err := other.Delete(ctx, r1, -1); err != nil {
		t.Fatal(err)
	}
	// The long view counts r1 at 4, and says why.
	vanished := func(b []topo.Straggler) bool {
		return len(b) == 1 && b[0].Member == r1 && b[0].MapVersion == 4 &&
			strings.Contains(b[0].Error, "at map version 4, record vanished ") &&
			strings.Contains(b[0].Error, "ago; counted until its session is shown ended (at most 1h0m0s)")
	}
	eventually(t, "r1 counted as vanished", func() bool { return vanished(long.Behind(5)) })
	if b := long.Behind(4); b != nil {
		t.Fatalf("a vanished member at 4 is not behind 4: %s", describeStragglers(b))
	}
	if b, err := long.Wait(ctx, 5, 100*time.Millisecond); err != nil || !vanished(b) {
		t.Fatalf("Wait while r1's record is gone: %s %v", describeStragglers(b), err)
	}
	if n := long.Members(); n != 2 {
		t.Fatalf("the long view counts %d members, want 2 (r1 vanished, h1)", n)
	}
	// The short view's grace passes: r1 is shown gone, and a Wait for a
	// version it never applied returns (woken by the grace's end, not by a
	// change: nothing changes any more).
	if b, err := short.Wait(ctx, 5, time.Minute); err != nil || b != nil {
		t.Fatalf("the short view after its grace: %s %v", describeStragglers(b), err)
	}
	eventually(t, "r1 forgotten by the short view", func() bool { return short.Members() == 1 })

	// The owner re-creates r1 at a new version: it counts as usual, in
	// both views.
	putRecord(t, owner, r1, routerRec("r1", 5))
	for _, v := range []*MemberView{long, short} {
		if b, err := v.Wait(ctx, 5, time.Minute); err != nil || b != nil {
			t.Fatalf("r1 back at 5: %s %v", describeStragglers(b), err)
		}
		if b := v.Behind(6); describeStragglers(b) != r1+"@5" {
			t.Fatalf("behind 6 with r1 back at 5: %s", describeStragglers(b))
		}
	}

	// A whole pool going away: h1 (at 6) vanishes with it, and counts.
	if err := other.DeleteAll(ctx, p.Pool("web")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "h1 counted as vanished with its pool", func() bool {
		b := long.Behind(7)
		return len(b) == 2 && b[0].Member == h1 && b[0].MapVersion == 6 && strings.Contains(b[0].Error, "record vanished")
	})
	eventually(t, "h1 forgotten by the short view", func() bool { return short.Members() == 1 })
}
