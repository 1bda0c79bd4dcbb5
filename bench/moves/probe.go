package main

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/topo"
)

// probe watches, while the moves run, the round-trip time of a small query
// on every node and of a ZooKeeper read, and the replication connections
// (walsenders) and COPYs of the bench's database on every node: what they
// are doing tells where a move's copy step spends its time (creating the
// slot, copying, enabling the subscription).
type probe struct {
	mu        sync.Mutex
	sightings []sighting
	pgRTT     []float64
	zkRTT     []float64
	zkWrite   []float64
	pgConnect []float64
	stop      chan struct{}
	wg        sync.WaitGroup
}

type sighting struct {
	at   time.Time
	node string
	kind string // slot (the move's slot), start (its apply worker), copy (source), ingest (target)
	slot string
}

const probeEvery = 20 * time.Millisecond

func (b *bench) startProbe(ctx context.Context) *probe {
	p := &probe{stop: make(chan struct{})}
	for _, n := range b.nodes {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			var c *pgx.Conn
			defer func() {
				if c != nil {
					c.Close(context.Background())
				}
			}()
			t := time.NewTicker(probeEvery)
			defer t.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-t.C:
				}
				if c == nil || c.IsClosed() {
					var err error
					if c, err = dbnode.Connect(ctx, n); err != nil {
						c = nil
						continue
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
					c.Close(context.Background())
					c = nil
					continue
				}
				qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					continue
				}
				rtt := float64(time.Since(start).Microseconds()) / 1000
				p.mu.Lock()
				p.pgRTT = append(p.pgRTT, rtt)
				for _, q := range qs {
					if k, slot := classify(q); k != "" {
						p.sightings = append(p.sightings, sighting{at: start, node: string(n.ID), kind: k, slot: slot})
					}
				}
				p.mu.Unlock()
			}
		}()
	}
	// Writes are timed on a scratch node beside the cluster.
	scratch, scratchErr := topo.CreateScratch(ctx, b.sess, b.st.Paths(), "moves-bench", nil)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		n := 0
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			start := time.Now()
			if _, _, err := topo.ReadMapData(ctx, b.sess, b.st.Paths()); err != nil {
				continue
			}
			read := float64(time.Since(start).Microseconds()) / 1000
			start = time.Now()
			err := scratchErr
			if err == nil {
				err = scratch.Write(ctx, []byte(start.String()))
			}
			write := float64(time.Since(start).Microseconds()) / 1000
			p.mu.Lock()
			p.zkRTT = append(p.zkRTT, read)
			if err == nil {
				p.zkWrite = append(p.zkWrite, write)
			}
			p.mu.Unlock()
			// A new connection to the new node, as the mover opens one
			// inside the pause (see the report).
			if n++; n%5 == 0 {
				start = time.Now()
				if c, err := dbnode.Connect(ctx, b.nodes[startNodes]); err == nil {
					d := float64(time.Since(start).Microseconds()) / 1000
					c.Close(context.Background())
					p.mu.Lock()
					p.pgConnect = append(p.pgConnect, d)
					p.mu.Unlock()
				}
			}
		}
	}()
	return p
}

func (p *probe) finish() {
	close(p.stop)
	p.wg.Wait()
}

// classify names what a replication connection is doing.
func classify(q string) (kind, slot string) {
	quoted := func() string {
		if i := strings.IndexByte(q, '"'); i >= 0 {
			if j := strings.IndexByte(q[i+1:], '"'); j >= 0 {
				return q[i+1 : i+1+j]
			}
		}
		return ""
	}
	switch {
	case strings.HasPrefix(q, "CREATE_REPLICATION_SLOT"):
		if s := quoted(); strings.HasPrefix(s, "sv_") {
			return "slot", s
		}
	case strings.HasPrefix(q, "START_REPLICATION"):
		if s := quoted(); strings.HasPrefix(s, "sv_") {
			return "start", s
		}
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
func (p *probe) copyPhases(row *MoveRow, rec *topo.MoveRecord) {
	var copyAt, catchupAt time.Time
	for _, st := range rec.Steps {
		switch st.State {
		case topo.MoveCopy:
			copyAt = st.At
		case topo.MoveCatchup:
			catchupAt = st.At
		}
	}
	row.SlotMS, row.LaunchMS, row.StartMS, row.DataMS, row.HandoverMS = -1, -1, -1, -1, -1
	if copyAt.IsZero() || catchupAt.IsZero() {
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
	ms := func(a, z time.Time) float64 { return float64(z.Sub(a).Microseconds()) / 1000 }
	if !slotEnd.IsZero() {
		row.SlotMS = ms(copyAt, slotEnd)
	}
	if !start.IsZero() {
		row.LaunchMS = ms(copyAt, start)
	}
	if !copyFirst.IsZero() {
		// The COPYs ran from about their first sighting to their last,
		// give or take a probe interval.
		copyLast = copyLast.Add(probeEvery / 2)
		copyFirst = copyFirst.Add(-probeEvery / 2)
		row.StartMS = max(ms(copyAt, copyFirst), 0)
		row.DataMS = ms(copyFirst, copyLast)
		row.HandoverMS = ms(copyLast, catchupAt)
		if row.DataMS > 0 {
			row.DataRowsPS = float64(rec.Stats.RowsCopied) / row.DataMS * 1000
		}
	}
}
