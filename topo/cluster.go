package topo

import (
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// ClusterVersion is the newest ClusterRecord format this build writes and
// reads. Format 2 added the sharded-table list ("tables"); a format-1 record
// is still read (it has no tables). A build that knows only format 1 refuses
// a format-2 record with "format version 2 is not supported (upgrade
// shardvisor?)", which is clearer than the "unknown field" it would
// otherwise report.
const ClusterVersion = 2

// ClusterRecord is stored at Paths.Cluster(). It is written by `shardctl
// init`; afterwards only the sharded-table list changes (`shardctl table`,
// by compare-and-swap, see UpdateCluster). The seed never changes, because
// changing it would move every user to another bucket.
type ClusterRecord struct {
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	Seed      string    `json:"seed"` // hex keystream seed
	CreatedAt time.Time `json:"created_at"`
	// Tables are the sharded tables, in the order they were added (format
	// 2). See docs/data-contract.md.
	Tables []TableRecord `json:"tables,omitempty"`
}

// TableRecord is one sharded table: a schema-qualified name and its bucket
// key column, a bigint holding keystream.Key(Prefix64(uid)).
type TableRecord struct {
	Name      string `json:"name"`       // "schema.table", lower-case unquoted identifiers
	KeyColumn string `json:"key_column"` // lower-case unquoted identifier
}

// identRE is a PostgreSQL identifier that needs no quoting and is not
// folded: lower-case letters, digits, '_' and '$', not starting with a
// digit or '$', at most 63 bytes (NAMEDATALEN-1).
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)

// ValidIdent checks a lower-case SQL identifier.
func ValidIdent(kind, s string) error {
	if !identRE.MatchString(s) {
		return fmt.Errorf("%s %q is not a plain lower-case SQL identifier (a-z, 0-9, '_', '$'; starting with a letter or '_'; at most 63 bytes)", kind, s)
	}
	return nil
}

// Schema and Table split a validated table name.
func (t TableRecord) Schema() string { s, _, _ := strings.Cut(t.Name, "."); return s }
func (t TableRecord) Table() string  { _, n, _ := strings.Cut(t.Name, "."); return n }

// Validate checks a table record's fields on their own.
func (t TableRecord) Validate() error {
	schema, table, ok := strings.Cut(t.Name, ".")
	if !ok || strings.Contains(table, ".") {
		return fmt.Errorf("table name %q must be schema-qualified: schema.table", t.Name)
	}
	if err := ValidIdent("schema", schema); err != nil {
		return fmt.Errorf("table %q: %w", t.Name, err)
	}
	if err := ValidIdent("table", table); err != nil {
		return fmt.Errorf("table %q: %w", t.Name, err)
	}
	if err := ValidIdent("key column", t.KeyColumn); err != nil {
		return fmt.Errorf("table %q: %w", t.Name, err)
	}
	if schema == "shardvisor" || strings.HasPrefix(schema, "pg_") || schema == "information_schema" {
		return fmt.Errorf("table %q: schema %q is reserved", t.Name, schema)
	}
	return nil
}

// ValidateTables checks a table list: each table valid, none listed twice.
func ValidateTables(ts []TableRecord) error {
	seen := map[string]bool{}
	for _, t := range ts {
		if err := t.Validate(); err != nil {
			return err
		}
		if seen[t.Name] {
			return fmt.Errorf("table %s is listed twice", t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}

// DecodeCluster decodes and validates a ClusterRecord.
func DecodeCluster(znode string, data []byte) (*ClusterRecord, error) {
	return decodeAs("cluster record", znode, data, ClusterVersion, (*ClusterRecord).validate)
}

func (r *ClusterRecord) validate() error {
	if err := ValidName("cluster", r.Name); err != nil {
		return err
	}
	if _, err := hex.DecodeString(r.Seed); err != nil || r.Seed == "" {
		return fmt.Errorf("seed %q is not hex", r.Seed)
	}
	if r.Version < 2 && len(r.Tables) > 0 {
		return fmt.Errorf(`"tables" needs format version 2, the record says %d`, r.Version)
	}
	return ValidateTables(r.Tables)
}
