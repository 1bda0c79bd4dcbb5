package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/migrate"
)

type results struct {
	Config     string             `json:"config"`
	Rebalances []*RebalanceResult `json:"rebalances"`
	Isolate    *IsolateResult     `json:"isolate,omitempty"`
	Outage     *OutageResult      `json:"outage,omitempty"`
	Targets    []Target           `json:"targets"`
}

// Target is one goal and whether this run met it. Info lines are
// findings with no target.
type Target struct {
	Goal string `json:"goal"`
	Got  string `json:"got"`
	Pass bool   `json:"pass"`
	Info bool   `json:"info,omitempty"`
}

// of is "n/m": failed of sent requests, or lost of checked writes.
func of(n, m int) string { return fmt.Sprintf("%d/%d", n, m) }

// when is the formatted text if c holds, "" otherwise.
func when(c bool, format string, args ...any) string {
	if !c {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

func (b *bench) report() {
	r := &b.res
	target := func(pass bool, goal, got string, args ...any) {
		r.Targets = append(r.Targets, Target{Goal: goal, Got: fmt.Sprintf(got, args...), Pass: pass})
	}
	fmt.Printf("\nshardvisor fleet benchmark: %s\n\n", r.Config)
	row := func(name, boots, rebal, pause, failed, lost, notes string) {
		fmt.Printf("%-44s %7s %9s %22s %13s %11s  %s\n", name, boots, rebal, pause, failed, lost, notes)
	}
	row("scenario", "boots", "rebalance", "pause p50/p99/max ms", "failed req", "lost writes", "notes")
	// Lists that missed acknowledged notes, gathered for an INFO line.
	var stale []string
	staleIn := func(name string, l loadStats) {
		if l.Stale > 0 {
			stale = append(stale, fmt.Sprintf("%s: %d, e.g. %s", name, l.Stale, l.StaleEx[0]))
		}
	}
	by := map[string]*RebalanceResult{}
	for _, x := range r.Rebalances {
		by[x.Name] = x
		notes := fmt.Sprintf("%d moves", x.Moves) + when(x.Aborted > 0, ", %d aborted", x.Aborted) +
			when(x.OverBudget, " (stopped at the %s budget)", *budget) + when(!x.OverBudget && !x.Balanced, ", NOT balanced") +
			fmt.Sprintf(", move p50 %.0f ms", x.MoveMS.P50) +
			// member wait: recorded by movers that report stragglers
			when(x.MemberWaitMS.Max > 0, ", member wait p50 %.0f max %.0f ms", x.MemberWaitMS.P50, x.MemberWaitMS.Max) +
			when(x.Victim != "", "; %s a straggler in %d moves, back %.1f s after SIGCONT", x.Victim, x.Stragglers[x.Victim], x.VictimBackS)
		row(x.Name, fmt.Sprintf("%.0f", x.Boots), fmt.Sprintf("%.1f s", x.Seconds),
			fmt.Sprintf("%.1f/%.1f/%.1f", x.PauseMS.P50, x.PauseMS.P99, x.PauseMS.Max),
			of(x.Load.Failed, x.Load.Requests), of(x.Verify.lost(), x.Verify.Checked), notes)
		staleIn(x.Name, x.Load)
	}
	swap, reload, boot := by["rebalance, swap"], by["rebalance, reload"], by[fmt.Sprintf("rebalance, reload, %s boot", *bootDelay)]
	if swap != nil && reload != nil {
		// Per move when a rebalance stopped at its budget, whole otherwise.
		perMove := func(x *RebalanceResult, v float64) float64 {
			if x.OverBudget || reload.OverBudget || swap.OverBudget {
				return v / float64(max(x.Moves, 1))
			}
			return v
		}
		row("  reload / swap"+when(reload.OverBudget || swap.OverBudget, " (per move)"), benchkit.RatioX(perMove(reload, reload.Boots), perMove(swap, swap.Boots)), benchkit.RatioX(perMove(reload, reload.Seconds), perMove(swap, swap.Seconds)),
			benchkit.RatioX(reload.PauseMS.P99, swap.PauseMS.P99)+" (p99)", "", "", fmt.Sprintf("move p50 %s", benchkit.RatioX(reload.MoveMS.P50, swap.MoveMS.P50)))
	}
	if boot != nil && reload != nil {
		row(fmt.Sprintf("  %s boot / no boot (reload)", *bootDelay), "", benchkit.RatioX(boot.Seconds, reload.Seconds),
			benchkit.RatioX(boot.PauseMS.P99, reload.PauseMS.P99)+" (p99)", "", "", fmt.Sprintf("move p50 %.0f vs %.0f ms: %s", boot.MoveMS.P50, reload.MoveMS.P50, benchkit.RatioX(boot.MoveMS.P50, reload.MoveMS.P50)))
	}
	if x := r.Isolate; x != nil {
		row(fmt.Sprintf("%s isolated (ZooKeeper + peers)", x.Member), fmt.Sprintf("k%.0f", x.Kills), "", "",
			of(x.OthersFailed, x.Load.Requests-x.OwnFailed), of(x.Verify.lost(), x.Verify.Checked),
			fmt.Sprintf("out of LB in %.2f s (bound 2/3 T + 1 s = %.2f s, T = %.1f s); own failed %d; back %.1f s after heal",
				x.OutMS/1000, x.BoundMS/1000, x.SessionMS/1000, x.OwnFailed, x.BackMS/1000))
		staleIn("isolate", x.Load)
	}
	if x := r.Outage; x != nil {
		row(fmt.Sprintf("ZooKeeper ensemble down %.0f s", x.DownS), fmt.Sprintf("k%.0f", x.Kills), "", "",
			of(x.Load.Failed, x.Load.Requests), of(x.Verify.lost(), x.Verify.Checked),
			fmt.Sprintf("back to normal %.1f s after the restart began (ensemble healthy after %.1f s); %.0f worker boots; kills %v", x.NormalS, x.RestartS, x.Boots, x.KillsByReason))
		staleIn("outage", x.Load)
	}
	fmt.Println("(boots: worker spawns across the fleet, from /metrics; kN: worker kills; failed req: failed/sent; lost writes: acknowledged writes missing/checked)")
	if len(r.Rebalances) > 0 {
		fmt.Println("where a move's time goes, p50 per step in ms (fence: map set moving, members caught up, source frozen):")
		for _, x := range r.Rebalances {
			var parts []string
			for _, st := range x.StepsMS {
				parts = append(parts, fmt.Sprintf("%s %.0f", st.Step, st.P50))
			}
			fmt.Printf("  %-42s %s\n", x.Name, strings.Join(parts, ", "))
			if len(x.Phases) > 0 {
				fmt.Printf("  %-42s %s\n", "  by phase (move records)", migrate.DescribeSummary(x.Phases))
			}
		}
	}
	fmt.Println()

	if reload != nil {
		swapBoots := "not run"
		if swap != nil {
			swapBoots = fmt.Sprintf("%.0f", swap.Boots)
		}
		target(reload.Boots == 0, "reload mode: 0 worker boots across the rebalance", "%.0f (swap: %s)", reload.Boots, swapBoots)
	}
	for _, x := range r.Rebalances {
		target(x.PauseMS.N > 0 && x.PauseMS.P99 < 50, fmt.Sprintf("%s: write pause p99 < 50 ms with %d supervisors", x.Name, *supervisors), "%.1f ms", x.PauseMS.P99)
		target(x.Balanced && x.Aborted == 0, x.Name+": rebalance completes, no move aborted", "balanced %v%s, %d aborted %v", x.Balanced,
			when(x.OverBudget, " (stopped at the budget)"), x.Aborted, x.AbortErrors)
		target(x.Load.Failed == 0 && x.Verify.lost() == 0, x.Name+": 0 failed requests, 0 lost writes", "%d failed %v, %d lost", x.Load.Failed, x.Load.Errors, x.Verify.lost())
		if x.Victim != "" {
			target(x.Stragglers[x.Victim] > 0, x.Name+": the stopped supervisor is reported as a straggler", "%d move records name it", x.Stragglers[x.Victim])
		}
	}
	if boot != nil && reload != nil {
		target(boot.MoveMS.P50 < reload.MoveMS.P50*1.5+500, fmt.Sprintf("reload mode: move time does not depend on a %s boot", *bootDelay), "move p50 %.0f ms vs %.0f ms", boot.MoveMS.P50, reload.MoveMS.P50)
	}
	if x := r.Isolate; x != nil {
		target(x.OutMS >= 0 && x.OutMS <= x.BoundMS, "isolated supervisor out of the load balancer within 2/3 T + 1 s", "%.2f s (bound %.2f s)", x.OutMS/1000, x.BoundMS/1000)
		target(x.OthersFailed == 0 && x.Verify.lost() == 0, "isolation: 0 failed requests on the other supervisors, 0 lost writes", "%d failed %v, %d lost", x.OthersFailed, x.Load.Errors, x.Verify.lost())
	}
	if x := r.Outage; x != nil {
		target(x.Load.Failed == 0 && x.Kills == 0, "whole-ensemble outage: 0 failed requests and 0 worker kills", "%d failed %v, %.0f kills", x.Load.Failed, x.Load.Errors, x.Kills)
		target(x.Verify.lost() == 0, "whole-ensemble outage: 0 lost writes", "%d lost", x.Verify.lost())
	}
	if len(stale) > 0 {
		r.Targets = append(r.Targets, Target{Info: true, Goal: "stale reads: lists that missed acknowledged notes (reads are not fenced)", Got: strings.Join(stale, "; ")})
	}
	fmt.Println("targets:")
	for _, t := range r.Targets {
		fmt.Printf("  %s  %-80s %s\n", cmp.Or(when(t.Info, "INFO"), when(t.Pass, "PASS"), "FAIL"), t.Goal, t.Got)
	}
	if *jsonOut != "" {
		if data, err := json.MarshalIndent(r, "", "  "); err != nil || os.WriteFile(*jsonOut, data, 0o644) != nil {
			say("could not write %s", *jsonOut)
		}
	}
}
