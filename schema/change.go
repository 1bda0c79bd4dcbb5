package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/shardvisor/shardvisor/topo"
)

// Change is one schema change as given to Apply: its id, its SQL text and
// where it came from.
type Change struct {
	ID     string
	SQL    string
	Source string
	// Mode and Statements are derived from SQL by Parse.
	Mode       string
	Statements int
	SHA256     string
	// NoTx names the statement that made the change ModeStatements.
	NoTx string
}

// ErrBadChange is a change text refused before it reaches any node.
var ErrBadChange = errors.New("bad schema change")

// Parse reads a change from a file's name and text. Its id is the one
// the text names in a line "-- shardvisor:id ID", else the file's name
// without its directory and ".sql". Two applies are the same change when
// their ids are the same; the text's SHA-256 then tells a resume (same
// text) from an edit (refused once the change is applied anywhere).
//
// A change runs in one transaction per node, unless it holds a statement
// PostgreSQL refuses in a transaction block (CREATE INDEX CONCURRENTLY,
// VACUUM, ...): then each statement runs on its own, in order, and a
// node's progress is kept by statement. Transaction control (BEGIN,
// COMMIT, ...) is refused: shardctl places the transaction.
func Parse(file, text string) (*Change, error) {
	id := HeaderID(text)
	if id == "" {
		id = strings.TrimSuffix(filepath.Base(file), ".sql")
	}
	if err := topo.ValidChangeID(id); err != nil {
		return nil, fmt.Errorf("%w: %s: %v (name the file after the change, or give it a line \"-- shardvisor:id ID\")", ErrBadChange, file, err)
	}
	if len(text) > topo.MaxSchemaSQL {
		return nil, fmt.Errorf("%w: %s is %d bytes; a change holds at most %d (split it into several changes)", ErrBadChange, file, len(text), topo.MaxSchemaSQL)
	}
	stmts, err := Split(text)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadChange, file, err)
	}
	if len(stmts) == 0 {
		return nil, fmt.Errorf("%w: %s holds no SQL statement", ErrBadChange, file)
	}
	c := &Change{ID: id, SQL: text, Source: filepath.Base(file), Mode: topo.ModeTransaction, Statements: len(stmts)}
	for _, st := range stmts {
		if tc := transactionControl(st.SQL); tc != "" {
			return nil, fmt.Errorf("%w: %s line %d: %s is not allowed: shardctl runs each change in its own transaction per node (remove it)", ErrBadChange, file, st.Line, tc)
		}
		if unnamedConcurrentIndex(st.SQL) {
			return nil, fmt.Errorf("%w: %s line %d: CREATE INDEX CONCURRENTLY needs an index name: without one PostgreSQL picks a new name on each run, and a build that failed would leave an invalid index nobody drops", ErrBadChange, file, st.Line)
		}
		if why, ok := outsideTransaction(st.SQL); ok && c.NoTx == "" {
			c.Mode, c.NoTx = topo.ModeStatements, fmt.Sprintf("%s at line %d", why, st.Line)
		}
	}
	sum := sha256.Sum256([]byte(text))
	c.SHA256 = hex.EncodeToString(sum[:])
	return c, nil
}
