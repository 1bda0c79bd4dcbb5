package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
)

func runACLCheck(c *cli.Context) error  { return runACL(c, "check") }
func runACLRepair(c *cli.Context) error { return runACL(c, "repair") }

// runACL walks the cluster's tree comparing every znode's ACL with the
// rule for its kind (topo.CheckACLs), and with repair sets them right.
func runACL(c *cli.Context, verb string) error {
	if c.NArg() > 0 {
		return cliutil.Usagef("acl %s takes no arguments, got %q", verb, c.Args().Slice())
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		f := topo.CheckACLs
		if verb == "repair" {
			f = topo.RepairACLs
		}
		rep, err := f(ctx, st.Session(), st.Paths())
		if err != nil {
			return fmt.Errorf("acl %s: %w", verb, err)
		}
		if rep.Diffs == nil {
			rep.Diffs = []topo.ACLDiff{}
		}
		// The Patroni groups the map names share the ensemble: their
		// records are part of what an attacker on it could write.
		if m, _, err := st.Load(ctx); err == nil {
			var dirs []string
			for _, n := range m.Nodes() {
				if !n.Patroni.IsZero() && n.State != bucketmap.NodeRemoved {
					dirs = append(dirs, topo.PatroniDir(n.Patroni.Namespace, n.Patroni.Scope))
				}
			}
			if rep.Patroni, rep.PatroniChecked, err = topo.CheckPatroniACLs(ctx, st.Session(), dirs); err != nil {
				return fmt.Errorf("acl %s: Patroni's records: %w", verb, err)
			}
		} else {
			log.Warn("the bucket map is unreadable: Patroni's records not checked", zap.Error(err))
		}
		for _, d := range rep.Diffs {
			if verb == "repair" {
				log.Info("acl repaired", zap.String("path", d.Path), zap.String("what", d.What))
			}
		}
		if err := cliutil.NewPrinter(c).Emit(rep, func(w io.Writer) { writeACLReport(w, rep, verb) }); err != nil {
			return err
		}
		if verb == "check" && len(rep.Diffs) > 0 {
			return hint.New(fmt.Errorf("acl check: %d znode(s) of cluster %s differ from the ACL rule", len(rep.Diffs), rep.Cluster), "`shardctl acl repair` sets them right")
		}
		if len(rep.Patroni) > 0 {
			return hint.New(fmt.Errorf("acl %s: %d znode(s) of the Patroni groups are writable by anyone", verb, len(rep.Patroni)),
				"Patroni owns them: run ZooKeeper with TLS and give each group's Patroni zookeeper.set_acls (docs/security.md)")
		}
		return nil
	})
}

func writeACLReport(w io.Writer, rep *topo.ACLReport, verb string) {
	writeClusterACLs(w, rep, verb)
	if rep.PatroniChecked == 0 {
		return
	}
	fmt.Fprintf(w, "Patroni groups: %d znodes checked", rep.PatroniChecked)
	if len(rep.Patroni) == 0 {
		fmt.Fprintln(w, "; none writable by anyone")
		return
	}
	fmt.Fprintf(w, "; %d writable by anyone (not repaired: Patroni's own):\n", len(rep.Patroni))
	for _, d := range rep.Patroni {
		fmt.Fprintf(w, "  %s  %s  want %s\n", d.Path, shortACL(d.Have), shortACL(d.Want))
	}
}

func writeClusterACLs(w io.Writer, rep *topo.ACLReport, verb string) {
	fmt.Fprintf(w, "cluster %s (%s): %d znodes checked", rep.Cluster, rep.Path, rep.Checked)
	if rep.Open {
		fmt.Fprint(w, "; the cluster is open (created without an admin identity): every znode is world:anyone:cdrwa")
	}
	switch {
	case len(rep.Diffs) == 0:
		fmt.Fprintln(w, "; every ACL follows the rule")
		return
	case verb == "repair":
		fmt.Fprintf(w, "; repaired %d:\n", len(rep.Diffs))
	default:
		fmt.Fprintf(w, "; %d differ from the ACL rule:\n", len(rep.Diffs))
	}
	rows := [][]string{{"PATH", "KIND", "HAVE", "WANT"}}
	for _, d := range rep.Diffs {
		at := strings.TrimPrefix(strings.TrimPrefix(d.Path, rep.Path), "/")
		if at == "" {
			at = "."
		}
		if d.What == "content" {
			at += " (record content)"
		}
		have := "(missing)"
		if d.Have != nil {
			have = shortACL(d.Have)
		}
		rows = append(rows, []string{at, d.Kind, have, shortACL(d.Want)})
	}
	width := make([]int, 3)
	for _, r := range rows {
		for i := range width {
			width[i] = max(width[i], len(r[i]))
		}
	}
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s  %-*s  %-*s  %s\n", width[0], r[0], width[1], r[1], width[2], r[2], r[3])
	}
	if verb == "check" {
		fmt.Fprintln(w, "(digest hashes shortened; --json shows them whole)")
	}
}

// shortACL renders entries with digest hashes cut to 8 characters, to
// keep the table readable.
func shortACL(es []topo.ACLEntry) string {
	var parts []string
	for _, e := range es {
		if user, hash, ok := strings.Cut(e.ID, ":"); ok && e.Scheme == "digest" && len(hash) > 8 {
			e.ID = user + ":" + hash[:8] + "…"
		}
		parts = append(parts, e.String())
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ",")
}
