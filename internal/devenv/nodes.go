package devenv

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// A node is either a plain PostgreSQL server or a Patroni group; its kind
// is fixed when it is created (pg/pgI/members records a group's size).

// existingNodes is the highest node number that has a data directory or is
// a group (0 if none).
func (e *Env) existingNodes() int {
	max := 0
	entries, _ := os.ReadDir(filepath.Join(e.c.Dir, "pg"))
	for _, d := range entries {
		n, ok := nodeNumber(d.Name())
		if !ok || n <= max {
			continue
		}
		if fileExists(filepath.Join(e.PGDir(n), "data", "PG_VERSION")) || fileExists(filepath.Join(e.PGDir(n), "members")) {
			max = n
		}
	}
	return max
}

// nodeNumber parses a node directory's name, "pg4".
func nodeNumber(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "pg")
	if !ok || s == "" {
		return 0, false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// NodeCount is how many nodes `up`, `status` and `env` deal with.
func (e *Env) NodeCount() int {
	if e.c.PGNodes > 0 {
		return e.c.PGNodes
	}
	return max(DefaultPGNodes, e.existingNodes())
}

// wantedMembers is how many members the configuration asks node i to have
// (1: a plain node).
func (e *Env) wantedMembers(i int) int {
	if e.c.HANodes != nil && !slices.Contains(e.c.HANodes, i) {
		return 1
	}
	return max(e.c.HA, 1)
}

// recordedMembers is what node i was created as (N members of a group, 1
// for a plain node); ok is false if it does not exist yet.
func (e *Env) recordedMembers(i int) (n int, ok bool, err error) {
	d := e.PGDir(i)
	if b, err := os.ReadFile(filepath.Join(d, "members")); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		n, err := strconv.Atoi(line)
		if err != nil || n < 1 || n > MaxMembers {
			return 0, false, fmt.Errorf("%s/members: expected a number of members, got '%s'", d, line)
		}
		return n, true, nil
	}
	if fileExists(filepath.Join(d, "data", "PG_VERSION")) {
		return 1, true, nil
	}
	return 0, false, nil
}

// Members is node i's number of members: as created, or for a new node as
// asked (1: plain).
func (e *Env) Members(i int) (int, error) {
	n, ok, err := e.recordedMembers(i)
	if err != nil || ok {
		return n, err
	}
	return e.wantedMembers(i), nil
}

// IsGroup reports whether node i is a Patroni group.
func (e *Env) IsGroup(i int) bool { return fileExists(filepath.Join(e.PGDir(i), "members")) }

func kindDesc(n int) string {
	if n == 1 {
		return "a plain PostgreSQL node"
	}
	return fmt.Sprintf("a Patroni group of %d members", n)
}

// existingKinds describes the existing nodes, for error messages.
func (e *Env) existingKinds() string {
	var plain, groups []string
	for i := 1; i <= e.existingNodes(); i++ {
		k, ok, err := e.recordedMembers(i)
		if err != nil || !ok {
			continue
		}
		if k == 1 {
			plain = append(plain, strconv.Itoa(i))
		} else {
			groups = append(groups, fmt.Sprintf("pg%d (%d members)", i, k))
		}
	}
	orNone := func(s []string, sep string) string {
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, sep)
	}
	return "plain nodes: " + orNone(plain, ",") + "; groups: " + orNone(groups, ", ")
}

// checkKind refuses a configuration that asks node i to be another kind
// than it was created as.
func (e *Env) checkKind(i int) error {
	if e.c.HA == 0 {
		return nil
	}
	have, ok, err := e.recordedMembers(i)
	if err != nil || !ok {
		return err
	}
	want := e.wantedMembers(i)
	if have == want {
		return nil
	}
	haNodes := "(all)"
	if e.c.HANodes != nil {
		s := make([]string, len(e.c.HANodes))
		for k, n := range e.c.HANodes {
			s[k] = strconv.Itoa(n)
		}
		haNodes = strings.Join(s, ",")
	}
	return fmt.Errorf("pg%d exists as %s, but SHARDVISOR_PG_HA=%d SHARDVISOR_PG_HA_NODES=%s asks for %s there. "+
		"A node's kind is fixed when it is created (%s). Run `scripts/devenv up` without SHARDVISOR_PG_HA "+
		"(existing nodes keep their kind) or with variables matching them; or drop node %d and its data first: "+
		"scripts/devenv pg-stop %d && rm -rf %s",
		i, kindDesc(have), e.c.HA, haNodes, kindDesc(want), e.existingKinds(), i, i, e.PGDir(i))
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
