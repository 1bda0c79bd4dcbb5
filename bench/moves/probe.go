package main

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/topo"
)

// probe watches, while the moves run, the round-trip time of a small query
// on every node and of a ZooKeeper read, and the replication connections
// (walsenders) and COPYs of the bench's database on every node: what they
// are doing tells where a move's copy step spends its time (creating the
// slot, copying, enabling the subscription).
type probe struct {
	*benchkit.Stopper
	mu        sync.Mutex
	sightings []sighting
	samples   [len(probeStats)][]float64 // ms, as probeStats names them
}

// probeStats name the probe's distributions in the summary.
var probeStats = [...]string{"pg_probe_ms", "zk_read_ms", "zk_write_ms", "pg_connect_ms"}

type sighting struct {
	at   time.Time
	node string
	kind string // slot (the move's slot), start (its apply worker), copy (source), ingest (target)
	slot string
}

const probeEvery = 20 * time.Millisecond

// add records sample i (probeStats[i]) taken since start.
func (p *probe) add(i int, start time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.samples[i] = append(p.samples[i], benchkit.MS(time.Since(start)))
}

func (b *bench) startProbe(ctx context.Context) *probe {
	p := &probe{Stopper: benchkit.NewStopper()}
	for _, n := range b.nodes {
		p.Go(func() {
			var c *pgx.Conn
			for pace := benchkit.NewPacer(probeEvery); pace.Wait(p.C); {
				if c == nil || c.IsClosed() {
					if c, _ = dbnode.Connect(ctx, n); c == nil {
						continue // nil with an error: try again at the next tick
					}
				}
				start := time.Now()
				// The walsenders and the move's COPYs (source side:
				// the mover quotes the table's name, the baseline does
				// not), and the COPYs being written (target side; the
				// baseline's go to another table).
				rows, err := c.Query(ctx, `SELECT query FROM pg_stat_activity WHERE state = 'active' AND datname = current_database()
						AND (backend_type = 'walsender' OR query LIKE 'COPY (SELECT % FROM "app"."kv" %')
					UNION ALL SELECT 'INGEST ' || relid::regclass::text FROM pg_stat_progress_copy WHERE datname = current_database() AND command = 'COPY FROM'`)
				if err != nil {
					c.Close(context.Background()) // reconnects at the next tick
					continue
				}
				qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					continue
				}
				p.add(0, start)
				p.mu.Lock()
				for _, q := range qs {
					if k, slot := classify(q); k != "" {
						p.sightings = append(p.sightings, sighting{at: start, node: string(n.ID), kind: k, slot: slot})
					}
				}
				p.mu.Unlock()
			}
			if c != nil {
				c.Close(context.Background())
			}
		})
	}
	// Writes are timed on a scratch node beside the cluster.
	scratch, scratchErr := topo.CreateScratch(ctx, b.sess, b.st.Paths(), "moves-bench", nil)
	p.Go(func() {
		for n, pace := 0, benchkit.NewPacer(100*time.Millisecond); pace.Wait(p.C); n++ {
			start := time.Now()
			if _, _, err := topo.ReadMapData(ctx, b.sess, b.st.Paths()); err != nil {
				continue
			}
			p.add(1, start)
			if start = time.Now(); scratchErr == nil && scratch.Write(ctx, []byte(start.String())) == nil {
				p.add(2, start)
			}
			// A new connection to the new node, as the mover opens one
			// inside the pause (see the report).
			if start = time.Now(); n%5 == 4 {
				if c, err := dbnode.Connect(ctx, b.nodes[startNodes]); err == nil {
					p.add(3, start)
					c.Close(context.Background())
				}
			}
		}
	})
	return p
}

// slotRE matches a replication command on one of the moves' slots.
var slotRE = regexp.MustCompile(`^(CREATE_REPLICATION_SLOT|START_REPLICATION)[^"]*"(sv_[^"]*)"`)

// classify names what a replication connection is doing.
func classify(q string) (kind, slot string) {
	switch m := slotRE.FindStringSubmatch(q); {
	case m != nil && m[1] == "CREATE_REPLICATION_SLOT":
		return "slot", m[2]
	case m != nil:
		return "start", m[2]
	case strings.HasPrefix(q, "COPY") && strings.Contains(q, "kv") && !strings.Contains(q, "move_marker"):
		return "copy", ""
	case q == "INGEST app.kv":
		return "ingest", ""
	}
	return "", ""
}

// copyPhases splits a move's copy step with the sightings on its nodes:
// until its slot exists (the replication connection creating it), until
// its COPYs start, the COPYs (the source sending, the target writing), and
// the rest (the subscription enabled). Its apply worker connects after
// that, once enabled (sighted up to 5 s after the step). Times in ms; -1:
// not seen (shorter than the probe interval).
func (p *probe) copyPhases(row *MoveRow, rec *topo.MoveRecord, at map[string]time.Time) {
	copyAt, catchupAt := at[topo.MoveCopy], at[topo.MoveCatchup]
	row.StartMS, row.DataMS, row.HandoverMS = -1, -1, -1
	if copyAt.IsZero() || catchupAt.IsZero() {
		row.SlotMS, row.LaunchMS = -1, -1
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var slotEnd, start, copyFirst, copyLast time.Time
	for _, s := range p.sightings {
		if s.at.Before(copyAt) || s.at.After(catchupAt.Add(5*time.Second)) {
			continue
		}
		if s.kind == "start" && s.node == rec.Source && s.slot == rec.Slot && start.IsZero() {
			start = s.at
			continue
		}
		if s.at.After(catchupAt) {
			continue
		}
		switch {
		case s.kind == "ingest" && s.node == rec.Target, s.kind == "copy" && s.node == rec.Source:
			if copyFirst.IsZero() || s.at.Before(copyFirst) {
				copyFirst = s.at
			}
			if s.at.After(copyLast) {
				copyLast = s.at
			}
		case s.kind == "slot" && s.node == rec.Source && s.slot == rec.Slot:
			slotEnd = s.at
		}
	}
	ms := func(a, z time.Time) float64 {
		if z.IsZero() {
			return -1
		}
		return benchkit.MS(z.Sub(a))
	}
	row.SlotMS, row.LaunchMS = ms(copyAt, slotEnd), ms(copyAt, start)
	if !copyFirst.IsZero() {
		// The COPYs ran from about their first sighting to their last,
		// give or take a probe interval.
		copyFirst, copyLast = copyFirst.Add(-probeEvery/2), copyLast.Add(probeEvery/2)
		row.StartMS, row.DataMS, row.HandoverMS = max(ms(copyAt, copyFirst), 0), ms(copyFirst, copyLast), ms(copyLast, catchupAt)
		if row.DataMS > 0 {
			row.DataRowsPS = float64(rec.Stats.RowsCopied) / row.DataMS * 1000
		}
	}
}
