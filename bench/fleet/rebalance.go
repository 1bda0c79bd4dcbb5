package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/clustertest"
	"github.com/shardvisor/shardvisor/migrate"
	"github.com/shardvisor/shardvisor/topo"
)

// StepStat is one move step's duration over the moves.
type StepStat struct {
	Step string `json:"step"`
	benchkit.Stat
}

// RebalanceResult is one rebalance of 3 -> 4 nodes.
type RebalanceResult struct {
	Name         string        `json:"name"`
	Mode         string        `json:"mode"`
	BootDelay    string        `json:"boot_delay,omitempty"`
	Boots        float64       `json:"worker_boots"`
	Kills        float64       `json:"worker_kills"`
	Seconds      float64       `json:"rebalance_seconds"`
	Moves        int           `json:"moves_done"`
	Aborted      int           `json:"moves_aborted"`
	Restarts     int           `json:"rebalancer_restarts"`
	Balanced     bool          `json:"balanced"`
	OverBudget   bool          `json:"stopped_at_budget,omitempty"`
	AbortErrors  []string      `json:"abort_errors,omitempty"`
	PauseMS      benchkit.Stat `json:"pause_ms"`
	MoveMS       benchkit.Stat `json:"move_ms"`
	MemberWaitMS benchkit.Stat `json:"member_wait_ms"`
	// StepsMS: each step's duration (the time from its start to the next
	// step's), p50 over the moves done, in step order.
	StepsMS []StepStat `json:"steps_ms"`
	// Phases: each phase's time over the moves done, from their records
	// (migrate.SummarizePhases, as the rebalance and bench/moves report it).
	Phases       []migrate.PhaseStat `json:"phases,omitempty"`
	Load         loadStats           `json:"load"`
	Verify       verification        `json:"verify"`
	Victim       string              `json:"victim,omitempty"`
	Stragglers   map[string]int      `json:"stragglers,omitempty"` // member -> moves that named it
	VictimBackS  float64             `json:"victim_back_seconds,omitempty"`
	ScrapeErrors []string            `json:"scrape_errors,omitempty"`
}

func (b *bench) rebalance(ctx context.Context, f *fleet, name string, victim *sup, wait time.Duration) error {
	res := &RebalanceResult{Name: name, Mode: f.mode, BootDelay: when(f.boot > 0, "%s", f.boot), Stragglers: map[string]int{}}
	b.res.Rebalances = append(b.res.Rebalances, res)
	var rbErr error // the rebalancer's: the run is measured and checked all the same
	if victim != nil {
		res.Victim = victim.name
	}
	skip := map[string]bool{res.Victim: true} // "" names no supervisor
	l, d, err := f.underLoad(ctx, strings.ReplaceAll(f.name, "-", "")+"rb", skip, 2*time.Second, &res.Verify, func(*balancer, *loadRun) error {
		if _, err := clustertest.AddNode(ctx, f.c.st, f.c.nodes[startNodes]); err != nil {
			return err
		}
		if victim != nil {
			victim.p.signal(syscall.SIGSTOP)
			say("%s: SIGSTOP %s (pid %d) for the whole rebalance; the mover's member wait is %s", name, victim.name, victim.p.pid(), wait)
		}
		say("%s: rebalancing 3 -> 4 nodes under load", name)
		t0 := time.Now()
		rbErr = b.runRebalancer(ctx, f, res, wait)
		res.Seconds = time.Since(t0).Seconds()
		if victim != nil {
			victim.p.signal(syscall.SIGCONT)
		}
		// Every supervisor on the final map, workers settled, the stopped one
		// back in service, before the boots are counted.
		tc := time.Now()
		if err := f.settleNow(ctx, 3*time.Minute); err != nil {
			return err
		}
		if victim != nil {
			res.VictimBackS = time.Since(tc).Seconds()
		}
		return nil
	})
	res.ScrapeErrors = d.errs
	if err != nil {
		return err
	}
	res.Boots, res.Kills = d.spawns, d.kills
	res.Load = l.stats(0)
	return rbErr
}

// runRebalancer runs the rebalancer until balanced (again after an
// aborted move, up to --retries times) and reads every move record.
func (b *bench) runRebalancer(ctx context.Context, f *fleet, res *RebalanceResult, wait time.Duration) error {
	var done int
	t0 := time.Now()
	// Past the budget the rebalancer stops between two moves: cancelled
	// as a move ends, it returns before starting the next one.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mv := migrate.New(f.c.st, migrate.Options{MemberWait: wait, Progress: func(prog migrate.Progress) {
		rec, msg := prog.Move, prog.Message
		switch {
		case msg == topo.MoveDone:
			done++
			if time.Since(t0) > *budget && !res.OverBudget {
				res.OverBudget = true
				say("  %s: past the %s budget after %d moves; stopping the rebalancer", res.Name, *budget, done)
				cancel()
			}
			if done%8 == 0 {
				say("  move %2d done: bucket %3d %s -> %s, pause %.1f ms, member wait %.0f ms", done, rec.Bucket, rec.Source, rec.Target, rec.Stats.PauseMS, rec.Stats.MemberWaitMS)
			}
		case msg == topo.MoveAborted || msg == topo.MoveFailed:
			say("  move of bucket %d %s -> %s %s: %s", rec.Bucket, rec.Source, rec.Target, msg, rec.Error)
		}
	}})
	rb := migrate.NewRebalancer(mv, bucketmap.Policy{Concurrency: 1})
	var rbErr error
	for attempt := 0; ; attempt++ {
		rep, err := rb.Run(rctx)
		if res.OverBudget {
			break
		}
		if err == nil && rep != nil && rep.Balanced {
			res.Balanced = true
			break
		}
		if err == nil {
			err = errors.New("not balanced")
		}
		if attempt >= retries || ctx.Err() != nil || errors.Is(err, migrate.ErrVerifyMismatch) {
			rbErr = fmt.Errorf("rebalance: %w", err)
			break
		}
		res.Restarts++
		say("  rebalancer stopped (%v); running it again (%d/%d)", err, attempt+1, retries)
	}
	ids, err := topo.ListMoves(ctx, b.sess, f.c.paths)
	if err != nil {
		return errors.Join(rbErr, err)
	}
	var pause, total, mwait []float64
	var finished []*topo.MoveRecord
	steps := map[string][]float64{}
	for _, id := range ids {
		rec, _, err := topo.ReadMove(ctx, b.sess, f.c.paths, id)
		if err != nil {
			return errors.Join(rbErr, err)
		}
		for _, s := range rec.Stragglers {
			res.Stragglers[s.Member[strings.LastIndexByte(s.Member, '/')+1:]]++
		}
		switch rec.State {
		case topo.MoveDone:
			res.Moves++
			finished = append(finished, rec)
			pause = append(pause, rec.Stats.PauseMS)
			mwait = append(mwait, rec.Stats.MemberWaitMS)
			total = append(total, benchkit.MS(rec.UpdatedAt.Sub(rec.CreatedAt)))
			for i := 0; i+1 < len(rec.Steps); i++ {
				steps[rec.Steps[i].State] = append(steps[rec.Steps[i].State], benchkit.MS(rec.Steps[i+1].At.Sub(rec.Steps[i].At)))
			}
		case topo.MoveAborted:
			res.Aborted++
			if len(res.AbortErrors) < 3 {
				res.AbortErrors = append(res.AbortErrors, rec.Error)
			}
		}
	}
	res.PauseMS, res.MoveMS, res.MemberWaitMS = benchkit.Of(pause), benchkit.Of(total), benchkit.Of(mwait)
	res.Phases = migrate.SummarizePhases(finished)
	// The slowest pauses, with where they went.
	slices.SortFunc(finished, func(a, b *topo.MoveRecord) int { return cmp.Compare(b.Stats.PauseMS, a.Stats.PauseMS) })
	for _, rec := range finished[:min(3, len(finished))] {
		say("  %s: slow pause: bucket %d %s -> %s %.1f ms (%s), member wait %.0f ms", res.Name, rec.Bucket, rec.Source, rec.Target, rec.Stats.PauseMS, rec.Stats.DescribePause(), rec.Stats.MemberWaitMS)
	}
	for _, st := range []string{topo.MovePrepare, topo.MoveCopy, topo.MoveCatchup, topo.MoveFence, topo.MoveBarrier, topo.MoveFlip, topo.MoveTeardown, topo.MoveVerify} {
		if xs := steps[st]; len(xs) > 0 {
			res.StepsMS = append(res.StepsMS, StepStat{Step: st, Stat: benchkit.Of(xs)})
		}
	}
	return rbErr
}
