package bucketmap

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// MapFormatVersion is the newest bucket map format this build reads and
// writes. A map at one depth is still written as version 1, byte for byte
// as before; only a map of mixed depths (single-bucket splits) is
// version 2, which a reader of an older release refuses as newer than it
// knows, instead of misreading its owners (docs/bucket-map.md, "Mixed
// depths").
const MapFormatVersion = 2

// MapFormatMixed is the first format version that stores mixed depths.
const MapFormatMixed = 2

// MapRecord is the wire form of the bucket map at topo.Paths.Map(). Decode
// turns it into a validated Map and Encode back; this struct only fixes
// the JSON. See docs/bucket-map.md.
//
// The map must stay well under ZooKeeper's 1 MiB limit at 2^16 buckets, so
// per-bucket data is packed: owners is a base64 string of one big-endian
// uint16 per bucket (an index into nodes), only buckets that are not plainly
// active are listed in buckets, and history is kept as bucket ranges so that
// a split doubles bounds instead of duplicating entries.
type MapRecord struct {
	Version    int          `json:"version"`
	MapVersion uint64       `json:"map_version"`
	Level      int          `json:"level"`
	UpdatedAt  time.Time    `json:"updated_at"`
	Nodes      []NodeRecord `json:"nodes"`
	Owners     string       `json:"owners"`
	// Depths (format version 2 only) is base64 of one byte per bucket,
	// in key order: that bucket's depth. Owners then has one entry per
	// bucket in the same order, not one per slot.
	Depths  string          `json:"depths,omitempty"`
	Buckets []BucketRecord  `json:"buckets,omitempty"`
	History []HandoffRecord `json:"history,omitempty"`
}

// NodeRecord is one db node in the registry. The DSN never carries a
// password; Password is a reference to where it comes from.
type NodeRecord struct {
	ID  string `json:"id"`
	DSN string `json:"dsn"`
	// PoolDSN: the application path through a transaction-mode pooler
	// (absent: dsn serves applications too).
	PoolDSN  string `json:"pool_dsn,omitempty"`
	Password string `json:"password,omitempty"` // "env:NAME" or "file:/path"
	// StreamUser: the role the moves' subscriptions to this node log in
	// as, by the subscribing server's client certificate (no password).
	StreamUser string `json:"stream_user,omitempty"`
	Weight     int    `json:"weight"`
	State      string `json:"state"` // active, draining, down, removed
	// Patroni, when set, names the node's Patroni group on the cluster's
	// ensemble: its members, leader and sync state are read from there.
	Patroni *PatroniRecord `json:"patroni,omitempty"`
}

// PatroniRecord names a Patroni group: its DCS lives under
// <namespace><scope>/ on the cluster's ZooKeeper ensemble.
type PatroniRecord struct {
	Namespace string `json:"namespace"`
	Scope     string `json:"scope"`
}

// BucketRecord is a bucket that is not plainly active.
type BucketRecord struct {
	Bucket uint32 `json:"bucket"`
	// Level is the bucket's depth when it is not the map's level (format
	// version 2); Bucket is its number at that depth.
	Level    int    `json:"level,omitempty"`
	State    string `json:"state"`            // active or moving
	Target   string `json:"target,omitempty"` // moving: the node it moves to
	Move     string `json:"move,omitempty"`   // moving: the move record id
	Since    uint64 `json:"since,omitempty"`  // map version at which the state began
	DataLost bool   `json:"data_lost,omitempty"`
}

// HandoffRecord says that node owned buckets lo..hi (inclusive, at the
// map's level) until map version until_version, at time at. GC uses it to
// know what it may delete from node, and when.
type HandoffRecord struct {
	Lo           uint32    `json:"lo"`
	Hi           uint32    `json:"hi"`
	Node         string    `json:"node"`
	UntilVersion uint64    `json:"until_version"`
	At           time.Time `json:"at"`
}

// DecodeMapRecord decodes a stored map record, plain or compressed
// (UnpackMapRecord), and its JSON strictly; the semantic checks are
// Decode's.
func DecodeMapRecord(znode string, data []byte) (*MapRecord, error) {
	js, _, err := UnpackMapRecord(znode, data)
	if err != nil {
		return nil, err
	}
	// Every watcher decodes the whole map on every change, so a good
	// record takes one strict pass; Decode's three passes (which order
	// its errors: a newer format version before an unknown field) run
	// only to explain a record that fails it. Both accept the same
	// records: one JSON object, nothing after it, no unknown field, a
	// version this build reads.
	var r MapRecord
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if dec.Decode(&r) == nil && r.Version >= 1 && r.Version <= MapFormatVersion {
		if _, err := dec.Token(); err == io.EOF {
			return &r, nil
		}
	}
	var slow MapRecord
	if err := topo.Decode("bucket map", znode, js, MapFormatVersion, &slow); err != nil {
		return nil, err
	}
	return &slow, nil
}

// MapEncoding is how the map record's JSON is stored in its znode. The
// record, its format version and what readers are handed (the map file,
// GET /v1/map) are the same JSON either way.
type MapEncoding string

const (
	// MapPlain stores the JSON itself.
	MapPlain MapEncoding = "plain"
	// MapGzip stores the JSON gzip-compressed (RFC 1952), so that a
	// fleet of watchers each re-reading the whole record on every change
	// reads a fraction of it: a 2^16-bucket map over 100 nodes is about
	// 180 KiB of JSON, from 3 KiB (owners in contiguous runs) to 89 KiB
	// (owners at random) compressed. A gzip stream starts with the bytes
	// 1f 8b, which no JSON text does, so readers tell the forms apart by
	// their first bytes; a reader of an older release refuses the
	// compressed form ("not JSON") and keeps its last map
	// (docs/bucket-map.md, "Stored form").
	MapGzip MapEncoding = "gzip"
)

// ParseMapEncoding checks an encoding's name.
func ParseMapEncoding(s string) (MapEncoding, error) {
	switch e := MapEncoding(s); e {
	case MapPlain, MapGzip:
		return e, nil
	}
	return "", fmt.Errorf("map encoding %q is not one of plain, gzip", s)
}

// MaxMapJSON bounds a map record's JSON, compressed or not: it must fit in
// a znode by itself, so that any record can be written back plain (to roll
// the encoding back) and so that a corrupt or hostile compressed record
// cannot make every reader inflate gigabytes.
const MaxMapJSON = zksession.MaxDataSize

// gzipMagic starts every gzip stream (RFC 1952, ID1 ID2).
var gzipMagic = []byte{0x1f, 0x8b}

// UnpackMapRecord returns the JSON of the map record stored as data (data
// itself when plain, inflated when gzip-compressed) and how it was stored.
// A compressed record that is corrupt, truncated, followed by other bytes
// or inflates beyond MaxMapJSON is a malformed record naming znode.
func UnpackMapRecord(znode string, data []byte) ([]byte, MapEncoding, error) {
	if !bytes.HasPrefix(data, gzipMagic) {
		return data, MapPlain, nil
	}
	fail := func(format string, args ...any) ([]byte, MapEncoding, error) {
		return nil, MapGzip, &topo.RecordError{Kind: "bucket map", Path: znode,
			Err: fmt.Errorf("%w: gzip-compressed record: "+format, append([]any{topo.ErrMalformed}, args...)...)}
	}
	broken := func(err error) ([]byte, MapEncoding, error) {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return fail("truncated (%d bytes stored)", len(data))
		}
		return fail("corrupt: %v", err)
	}
	br := bytes.NewReader(data)
	zr, err := gzip.NewReader(br)
	if err != nil {
		return broken(err)
	}
	// One stream only: a second one appended would be data no writer put
	// there (gzip readers concatenate them by default).
	zr.Multistream(false)
	js, err := io.ReadAll(io.LimitReader(zr, MaxMapJSON+1))
	if err != nil {
		return broken(err)
	}
	if len(js) > MaxMapJSON {
		return fail("inflates to more than %d bytes, the most a map record may hold", MaxMapJSON)
	}
	// io.ReadAll stopped at the end of the stream, which checked its
	// CRC-32 and length; bytes after it are not part of the record.
	if br.Len() > 0 {
		return fail("%d bytes of trailing data after the compressed stream", br.Len())
	}
	return js, MapGzip, nil
}

// PackMapRecord renders a map record's JSON as stored in encoding enc (""
// is plain). It refuses JSON over MaxMapJSON whatever the encoding.
func PackMapRecord(js []byte, enc MapEncoding) ([]byte, error) {
	if len(js) > MaxMapJSON {
		return nil, fmt.Errorf("bucket map record is %d bytes, over the %d a znode holds (the limit applies to its plain form even when stored compressed)", len(js), MaxMapJSON)
	}
	switch enc {
	case "", MapPlain:
		return js, nil
	case MapGzip:
		var b bytes.Buffer
		// BestSpeed: the writer compresses inside a move's write pause
		// (the flip); on a 2^16-bucket map with scattered owners it takes
		// a quarter of the default level's time for 10% more bytes.
		zw, err := gzip.NewWriterLevel(&b, gzip.BestSpeed)
		if err != nil {
			return nil, err
		}
		if _, err := zw.Write(js); err != nil {
			return nil, err
		}
		if err := zw.Close(); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	return nil, fmt.Errorf("unknown map encoding %q", enc)
}
