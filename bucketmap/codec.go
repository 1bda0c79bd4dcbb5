package bucketmap

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"

	"github.com/shardvisor/shardvisor/topo"
)

// Decode parses and validates a map record as stored, plain or compressed
// (MapEncoding). The error names the znode and exactly what is wrong;
// a map that fails is never partly used.
func Decode(znode string, data []byte) (*Map, error) {
	m, _, err := DecodeRecord(znode, data)
	return m, err
}

// DecodeRecord is Decode for a reader that also hands the record on (the
// map file for workers, GET /v1/map): it returns the record's plain JSON
// too, the stored bytes themselves when plain, so that those documents
// are the same whatever the encoding and it is inflated only once.
func DecodeRecord(znode string, data []byte) (*Map, []byte, error) {
	js, enc, err := UnpackMapRecord(znode, data)
	if err != nil {
		return nil, nil, err
	}
	rec, err := DecodeMapRecord(znode, js)
	if err != nil {
		return nil, nil, err
	}
	m, err := fromRecord(rec)
	if err != nil {
		return nil, nil, &topo.RecordError{Kind: "bucket map", Path: znode, Err: fmt.Errorf("%w: %v", topo.ErrMalformed, err)}
	}
	m.Encoding = enc
	return m, js, nil
}

func fromRecord(r *MapRecord) (*Map, error) {
	if r.Level < 0 || r.Level > MaxDepth || (r.Depths == "" && r.Level > MaxLevel) {
		return nil, fmt.Errorf("level %d out of range 0..%d (0..%d at mixed depths)", r.Level, MaxLevel, MaxDepth)
	}
	m := &Map{Version: r.MapVersion, Level: r.Level, UpdatedAt: r.UpdatedAt,
		index: make(map[NodeID]int, len(r.Nodes)), meta: map[uint32]BucketMeta{}}
	if len(r.Nodes) > MaxNodes {
		return nil, fmt.Errorf("%d db nodes, more than %d", len(r.Nodes), MaxNodes)
	}
	for i, n := range r.Nodes {
		node := Node{ID: NodeID(n.ID), DSN: n.DSN, PoolDSN: n.PoolDSN, Password: n.Password, StreamUser: n.StreamUser, Weight: n.Weight, State: NodeState(n.State)}
		if n.Patroni != nil {
			node.Patroni = Patroni{Namespace: n.Patroni.Namespace, Scope: n.Patroni.Scope}
		}
		if _, dup := m.index[node.ID]; dup {
			return nil, fmt.Errorf("node %s is listed twice", node.ID)
		}
		m.index[node.ID] = i
		m.nodes = append(m.nodes, node)
	}
	raw, err := base64.StdEncoding.DecodeString(r.Owners)
	if err != nil {
		return nil, fmt.Errorf("owners: not base64: %v", err)
	}
	if r.Depths == "" {
		if r.Version >= MapFormatMixed {
			return nil, fmt.Errorf("format version %d lists the depths of its buckets, and this record has none (a map at one depth is format version 1)", r.Version)
		}
		if len(raw) != 2*m.Slots() {
			return nil, fmt.Errorf("owners: %d bytes, want %d (2 per bucket at level %d)", len(raw), 2*m.Slots(), m.Level)
		}
		m.owners = make([]uint16, m.Slots())
		for b := range m.owners {
			m.owners[b] = binary.BigEndian.Uint16(raw[2*b:])
		}
	} else if err := m.decodeMixed(r, raw); err != nil {
		return nil, err
	}
	for _, br := range r.Buckets {
		b := Bucket{br.Bucket, m.Level}
		if br.Level != 0 {
			b.Depth = br.Level
		}
		if !m.Has(b) {
			return nil, fmt.Errorf("buckets: %v", m.notABucket(b))
		}
		lo, _ := m.SlotsOf(b)
		if _, dup := m.meta[lo]; dup {
			return nil, fmt.Errorf("bucket %s is listed twice", b)
		}
		m.meta[lo] = BucketMeta{State: BucketState(br.State), Target: NodeID(br.Target), Move: br.Move, Since: br.Since, DataLost: br.DataLost}
	}
	for _, h := range r.History {
		m.history = append(m.history, Handoff{Lo: h.Lo, Hi: h.Hi, Node: NodeID(h.Node), UntilVersion: h.UntilVersion, At: h.At})
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// Encode validates m and renders its record as stored, in m.Encoding.
func Encode(m *Map) ([]byte, error) {
	js, err := EncodeJSON(m)
	if err != nil {
		return nil, err
	}
	return PackMapRecord(js, m.Encoding)
}

// EncodeJSON validates m and renders its record's plain JSON, whatever
// m.Encoding. Maps are large, so the JSON is compact.
func EncodeJSON(m *Map) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("refusing to encode an inconsistent bucket map: %w", err)
	}
	rec := MapRecord{Version: 1, MapVersion: m.Version, Level: m.Level, UpdatedAt: m.UpdatedAt.UTC()}
	for _, n := range m.nodes {
		nr := NodeRecord{ID: string(n.ID), DSN: n.DSN, PoolDSN: n.PoolDSN, Password: n.Password, StreamUser: n.StreamUser, Weight: n.Weight, State: string(n.State)}
		if !n.Patroni.IsZero() {
			nr.Patroni = &PatroniRecord{Namespace: n.Patroni.Namespace, Scope: n.Patroni.Scope}
		}
		rec.Nodes = append(rec.Nodes, nr)
	}
	if m.depth == nil {
		raw := make([]byte, 2*len(m.owners))
		for b, o := range m.owners {
			binary.BigEndian.PutUint16(raw[2*b:], o)
		}
		rec.Owners = base64.StdEncoding.EncodeToString(raw)
	} else {
		rec.Version = MapFormatMixed
		raw := make([]byte, 0, 2*m.Buckets())
		depths := make([]byte, 0, m.Buckets())
		m.EachBucket(func(b Bucket, lo, _ uint32) bool {
			raw = binary.BigEndian.AppendUint16(raw, m.owners[lo])
			depths = append(depths, byte(b.Depth))
			return true
		})
		rec.Owners = base64.StdEncoding.EncodeToString(raw)
		rec.Depths = base64.StdEncoding.EncodeToString(depths)
	}
	for _, b := range m.NonActive() {
		lo, _ := m.SlotsOf(b)
		bm := m.meta[lo]
		br := BucketRecord{Bucket: b.Prefix, State: string(bm.State), Target: string(bm.Target), Move: bm.Move, Since: bm.Since, DataLost: bm.DataLost}
		if b.Depth != m.Level {
			br.Level = b.Depth
		}
		rec.Buckets = append(rec.Buckets, br)
	}
	for _, h := range m.history {
		rec.History = append(rec.History, HandoffRecord{Lo: h.Lo, Hi: h.Hi, Node: string(h.Node), UntilVersion: h.UntilVersion, At: h.At.UTC()})
	}
	return topo.EncodeCompact(rec)
}

// decodeMixed builds the directory of a format version 2 record: one owner
// and one depth per bucket, in key order.
func (m *Map) decodeMixed(r *MapRecord, raw []byte) error {
	if r.Version < MapFormatMixed {
		return fmt.Errorf("depths: a map of mixed depths is format version %d, not %d", MapFormatMixed, r.Version)
	}
	depths, err := base64.StdEncoding.DecodeString(r.Depths)
	if err != nil {
		return fmt.Errorf("depths: not base64: %v", err)
	}
	if len(raw) != 2*len(depths) {
		return fmt.Errorf("owners: %d bytes for %d buckets (depths), want 2 per bucket", len(raw), len(depths))
	}
	m.owners = make([]uint16, m.Slots())
	m.depth = make([]uint8, m.Slots())
	s := 0
	for i, d := range depths {
		if int(d) > m.Level {
			return fmt.Errorf("depths: bucket %d in key order is at depth %d, deeper than the map's level %d", i, d, m.Level)
		}
		run := 1 << (m.Level - int(d))
		if s+run > m.Slots() {
			return fmt.Errorf("depths: the buckets cover more than the key space (bucket %d in key order ends past slot %d)", i, m.Slots()-1)
		}
		if s%run != 0 {
			return fmt.Errorf("depths: bucket %d in key order is at depth %d but starts at slot %d, not a multiple of %d", i, d, s, run)
		}
		o := binary.BigEndian.Uint16(raw[2*i:])
		for t := s; t < s+run; t++ {
			m.owners[t], m.depth[t] = o, d
		}
		s += run
	}
	if s != m.Slots() {
		return fmt.Errorf("depths: the buckets cover %d of the %d slots at level %d", s, m.Slots(), m.Level)
	}
	return nil
}
