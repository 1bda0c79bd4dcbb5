package supervisor

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
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
