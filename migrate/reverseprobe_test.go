package migrate

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/topo"
)

// The probe's verdict from what each server answered: lost only when a
// server that answered says the slot or the subscription is gone (or the
// slot invalidated), whatever the other did; a server that did not answer
// makes it unknown, never lost; a disabled subscription with its slot is
// a way back that still exists.
func TestReverseProbeClassification(t *testing.T) {
	until := time.Now().Add(time.Hour)
	rec := &topo.MoveRecord{ID: "m1", Source: "pg1", Target: "pg2", State: topo.MoveReversible,
		Reverse: &topo.ReverseStream{Publication: "sv_m1_r", Slot: "sv_m1_r", Subscription: "sv_m1_r", StartLSN: "0/1", Enabled: true, Until: &until}}
	lag := int64(4096)
	down := errors.New("connection refused")
	running := reverseObs{subFound: true, subEnabled: true, slotFound: true, walStatus: "reserved", lag: &lag}
	with := func(f func(*reverseObs)) reverseObs { o := running; f(&o); return o }
	for _, tc := range []struct {
		name   string
		obs    reverseObs
		state  string
		reason string // a part of it
		lag    bool
	}{
		{"running", running, ReverseRunning, "", true},
		{"running, slot about to be invalidated", with(func(o *reverseObs) { o.walStatus = "unreserved" }), ReverseRunning, "about to be invalidated", true},
		{"subscription disabled", with(func(o *reverseObs) { o.subEnabled = false }), ReverseDisabled, "disabled", true},
		{"slot gone: the target failed over", with(func(o *reverseObs) { o.slotFound, o.walStatus, o.lag, o.subEnabled = false, "", nil, false }), ReverseLost, "slot sv_m1_r is gone from pg2", false},
		{"slot gone, source away", with(func(o *reverseObs) { o.slotFound, o.srcErr, o.subFound = false, down, false }), ReverseLost, "gone from pg2", false},
		{"slot invalidated", with(func(o *reverseObs) { o.walStatus = "lost" }), ReverseLost, "invalidated", false},
		{"subscription gone", with(func(o *reverseObs) { o.subFound = false }), ReverseLost, "subscription sv_m1_r is gone from pg1", false},
		{"subscription gone, target away", with(func(o *reverseObs) { o.subFound, o.dstErr, o.slotFound = false, down, false }), ReverseLost, "gone from pg1", false},
		{"target away", with(func(o *reverseObs) { o.dstErr, o.slotFound, o.lag = down, false, nil }), ReverseUnknown, "target pg2 did not answer", false},
		{"source away", with(func(o *reverseObs) { o.srcErr, o.subFound = down, false }), ReverseUnknown, "source pg1 did not answer", true},
		{"both away", reverseObs{srcErr: down, dstErr: down}, ReverseUnknown, "did not answer", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := classifyReverse(rec, tc.obs)
			if p.State != tc.state || !strings.Contains(p.Reason, tc.reason) || (tc.reason == "" && p.Reason != "") {
				t.Fatalf("got %s (%q), want %s (%q)", p.State, p.Reason, tc.state, tc.reason)
			}
			if (p.LagBytes != nil) != tc.lag {
				t.Fatalf("lag %v, want known %v", p.LagBytes, tc.lag)
			}
		})
	}
	// Only a started stream, not recorded lost, in reverse, verify or
	// the window is probed.
	for _, tc := range []struct {
		state   string
		enabled bool
		lost    string
		want    bool
	}{
		{topo.MoveReversible, true, "", true}, {topo.MoveVerify, true, "", true}, {topo.MoveReverse, false, "", false},
		{topo.MoveReversible, false, "gone", false}, {topo.MoveCompleting, true, "", false}, {topo.MoveDone, true, "", false},
	} {
		r := *rec
		rv := *rec.Reverse
		r.State, rv.Enabled, rv.Lost, r.Reverse = tc.state, tc.enabled, tc.lost, &rv
		if got := probed(&r); got != tc.want {
			t.Errorf("probed(%s, enabled %v, lost %q) = %v", tc.state, tc.enabled, tc.lost, got)
		}
	}
}
