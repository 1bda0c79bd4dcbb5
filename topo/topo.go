// Package topo defines where shardvisor keeps things in ZooKeeper and how
// each record is encoded. It is the only place that builds a path or picks a
// record format; docs/zookeeper-layout.md describes the same tree for
// operators and for admin scripts in other languages.
//
// Every record is a JSON object with a "version" field naming its format
// version. Decoding is strict: unknown fields, a missing or unsupported
// version, and trailing data are errors that name the path and the problem,
// so a hand-edited znode never half-loads.
package topo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
)

// DefaultRoot is the parent of all clusters unless configured otherwise.
const DefaultRoot = "/shardvisor"

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidName checks a cluster, pool or member name: lowercase letters,
// digits, '-' and '_', starting with a letter or digit, at most 63 bytes,
// so that it is a safe path component and a safe label in metrics.
func ValidName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%s name %q is invalid: use 1-63 of a-z, 0-9, '-' and '_', starting with a letter or digit", kind, name)
	}
	return nil
}

// Paths builds the paths of one cluster.
type Paths struct {
	root    string
	cluster string
}

// NewPaths validates root and cluster. root "" means DefaultRoot.
func NewPaths(root, cluster string) (Paths, error) {
	if root == "" {
		root = DefaultRoot
	}
	if root[0] != '/' || (len(root) > 1 && root[len(root)-1] == '/') || path.Clean(root) != root {
		return Paths{}, fmt.Errorf("zookeeper root %q must be an absolute, clean path such as /shardvisor", root)
	}
	if err := ValidName("cluster", cluster); err != nil {
		return Paths{}, err
	}
	return Paths{root: root, cluster: cluster}, nil
}

// MustPaths is NewPaths for constants in tests and examples.
func MustPaths(root, cluster string) Paths {
	p, err := NewPaths(root, cluster)
	if err != nil {
		panic(err)
	}
	return p
}

func (p Paths) Root() string        { return p.root }
func (p Paths) ClusterName() string { return p.cluster }

// Cluster holds the ClusterRecord; everything else of the cluster is below.
func (p Paths) Cluster() string { return path.Join(p.root, p.cluster) }

// Map holds the bucket map record, written only by compare-and-swap.
func (p Paths) Map() string { return path.Join(p.Cluster(), "map") }

// Pools is the parent of all pools.
func (p Paths) Pools() string { return path.Join(p.Cluster(), "pools") }

// Pool is one supervisor pool's directory.
func (p Paths) Pool(name string) string { return path.Join(p.Pools(), name) }

// PoolConfig holds a pool's config record.
func (p Paths) PoolConfig(name string) string { return path.Join(p.Pool(name), "config") }

// PoolStatus holds the last swap result published for a pool.
func (p Paths) PoolStatus(name string) string { return path.Join(p.Pool(name), "status") }

// PoolMembers is the parent of the pool's ephemeral member records.
func (p Paths) PoolMembers(name string) string { return path.Join(p.Pool(name), "members") }

// PoolMember is one supervisor's ephemeral member record.
func (p Paths) PoolMember(pool, member string) string {
	return path.Join(p.PoolMembers(pool), member)
}

// Routers is the parent of the routers' ephemeral member records.
func (p Paths) Routers() string { return path.Join(p.Cluster(), "routers") }

// Router is one router's ephemeral member record.
func (p Paths) Router(member string) string { return path.Join(p.Routers(), member) }

// Moves is the parent of move records.
func (p Paths) Moves() string { return path.Join(p.Cluster(), "moves") }

// Move is one bucket move's record.
func (p Paths) Move(id string) string { return path.Join(p.Moves(), id) }

// Locks is the parent of lock and election directories.
func (p Paths) Locks() string { return path.Join(p.Cluster(), "locks") }

// Lock is one named lock or election (for example "rebalance", "gc").
func (p Paths) Lock(name string) string { return path.Join(p.Locks(), name) }

// Probe is where `shardctl zk ping` writes its scratch node: beside the
// clusters, under a name no cluster can have, so that a ping never makes a
// cluster appear to exist.
func (p Paths) Probe(id string) string { return path.Join(p.root, ".probes", id) }

// RecordError says which record failed to decode and why.
type RecordError struct {
	Kind string // "cluster record", "bucket map", ...
	Path string // znode path, when known
	Err  error
}

func (e *RecordError) Error() string {
	if e.Path != "" {
		return fmt.Sprintf("%s at %s: %v", e.Kind, e.Path, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Kind, e.Err)
}
func (e *RecordError) Unwrap() error { return e.Err }

// ErrMalformed is wrapped by every decoding failure.
var ErrMalformed = errors.New("malformed record")

// Encode marshals a record. Records are small; indentation keeps them
// readable in zkCli and diffs, except where a record says otherwise.
func Encode(v any) ([]byte, error) {
	return json.MarshalIndent(v, "", "  ")
}

// EncodeCompact marshals a record without indentation, for large records.
func EncodeCompact(v any) ([]byte, error) {
	return json.Marshal(v)
}

// decodeAs decodes a record of one kind strictly (Decode), then checks it
// with check (nil: nothing more to check), whose error is a malformed
// record too.
func decodeAs[T any](kind, znode string, data []byte, maxVersion int, check func(*T) error) (*T, error) {
	var r T
	if err := Decode(kind, znode, data, maxVersion, &r); err != nil {
		return nil, err
	}
	if check != nil {
		if err := check(&r); err != nil {
			return nil, &RecordError{Kind: kind, Path: znode, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
		}
	}
	return &r, nil
}

// Decode unmarshals a record strictly: data must be one JSON object whose
// "version" is between 1 and maxVersion, with no unknown fields.
func Decode(kind, znode string, data []byte, maxVersion int, v any) error {
	fail := func(format string, args ...any) error {
		return &RecordError{Kind: kind, Path: znode, Err: fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return fail("empty")
	}
	// Split off one JSON value first so that trailing data gets its own
	// message rather than a parser error.
	var raw json.RawMessage
	outer := json.NewDecoder(bytes.NewReader(data))
	if err := outer.Decode(&raw); err != nil {
		return fail("not JSON: %v", err)
	}
	if _, err := outer.Token(); err != io.EOF {
		return fail("trailing data after the JSON object")
	}
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return fail("not a JSON object: %v", err)
	}
	if head.Version == nil {
		return fail(`no "version" field`)
	}
	if *head.Version < 1 || *head.Version > maxVersion {
		return fail("format version %d is not supported (this build reads 1 to %d; upgrade shardvisor?)", *head.Version, maxVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fail("%v", err)
	}
	return nil
}
