package fence

import (
	"context"
	"fmt"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

// StrandedRanges are the key ranges of the buckets that node handed over
// without a copy and still has in the map's history: buckets marked
// DataLost (reassigned by `node down` or `assign --no-copy`) that another
// node owns now and that node owned before. Rows node holds there were
// written to it before the map changed and are on no owner. Neighbouring
// buckets are merged.
func StrandedRanges(m *bucketmap.Map, node bucketmap.NodeID) [][2]int64 {
	// By directory slot, the unit history ranges are kept in.
	lost := map[uint32]bool{}
	for _, b := range m.NonActive() {
		if m.MetaOf(b).DataLost && m.OwnerOf(b) != node {
			lo, hi := m.SlotsOf(b)
			for s := lo; s <= hi; s++ {
				lost[s] = true
			}
		}
	}
	handed := map[uint32]bool{}
	for _, h := range m.History() {
		if h.Node != node {
			continue
		}
		for b := h.Lo; b <= h.Hi; b++ {
			if lost[b] {
				handed[b] = true
			}
		}
	}
	var out [][2]int64
	for b := 0; b < m.Slots(); b++ {
		if !handed[uint32(b)] {
			continue
		}
		lo, hi, _ := keystream.Range(m.Level, uint32(b))
		if n := len(out); n > 0 && out[n-1][1]+1 == lo {
			out[n-1][1] = hi
			continue
		}
		out = append(out, [2]int64{lo, hi})
	}
	return out
}

// CheckStranded reports, per sharded table, the rows node holds in the
// buckets it lost without a copy (StrandedRanges): rows the application
// wrote to it before it was marked down (or before an `assign --no-copy`),
// which readers of the new owner do not see. GC keeps them (the owner
// holds fewer rows); an operator recovers them (docs/data-contract.md,
// "Rows a node kept"). Once they are gone (recovered and GC'd, or deleted
// knowingly) nothing is reported. It changes nothing.
func CheckStranded(ctx context.Context, q Querier, tables []topo.TableRecord, m *bucketmap.Map, node bucketmap.NodeID) ([]Mismatch, error) {
	ranges := StrandedRanges(m, node)
	if len(ranges) == 0 {
		return nil, nil
	}
	var out []Mismatch
	for _, t := range tables {
		var rel *uint32
		if err := q.QueryRow(ctx, `SELECT to_regclass($1)::oid`, qualified(t)).Scan(&rel); err != nil {
			return nil, err
		}
		if rel == nil {
			continue // CheckTables reports it
		}
		var bigint bool
		err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND attnum > 0 AND NOT attisdropped AND atttypid = 'pg_catalog.int8'::pg_catalog.regtype)`, *rel, t.KeyColumn).Scan(&bigint)
		if err != nil {
			return nil, err
		}
		if !bigint {
			continue // CheckTables reports the column
		}
		for _, r := range ranges {
			var n int64
			err := q.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s BETWEEN $1 AND $2`, qualified(t), quoteIdent(t.KeyColumn)), r[0], r[1]).Scan(&n)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				continue
			}
			owners := ownersOf(m, r[0], r[1])
			out = append(out, Mismatch{Kind: KindStrandedRows, Table: t.Name, Message: fmt.Sprintf(
				"%d rows in %s (keys %d..%d), which this node lost without a copy (node down or assign --no-copy; owned now by %s): written here before the map changed, they are on no owner and its readers do not see them; recover them (docs/data-contract.md, \"Rows a node kept\") or delete them knowingly",
				n, BucketsOf(m, r[0], r[1]), r[0], r[1], owners)})
		}
	}
	return out, nil
}

// ownersOf names the owners of the buckets of lo..hi, for people.
func ownersOf(m *bucketmap.Map, lo, hi int64) string {
	blo := keystream.BucketOf(keystream.PrefixFromKey(lo), m.Level)
	bhi := keystream.BucketOf(keystream.PrefixFromKey(hi), m.Level)
	seen := map[bucketmap.NodeID]bool{}
	s := ""
	for b := blo; b <= bhi; b++ { // directory slots: each names its bucket's owner
		if o := m.Owner(b); !seen[o] {
			seen[o] = true
			if s != "" {
				s += ", "
			}
			s += string(o)
		}
	}
	return s
}
