package bucketmap

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// NodeSummary is one node's line in a status report.
type NodeSummary struct {
	ID     NodeID    `json:"id"`
	State  NodeState `json:"state"`
	Weight int       `json:"weight"`
	DSN    string    `json:"dsn"`
	// PoolDSN is the application path through a pooler (Node.PoolDSN).
	PoolDSN  string `json:"pool_dsn,omitempty"`
	Password string `json:"password_ref,omitempty"`
	// StreamUser is the role the moves' streams log in to it as, by
	// certificate (Node.StreamUser).
	StreamUser string  `json:"stream_user,omitempty"`
	Buckets    int     `json:"buckets"`
	Share      float64 `json:"share"`      // fraction of all buckets it owns
	FairShare  float64 `json:"fair_share"` // fraction it should own by weight
	// Patroni names the node's group, if it is one; Members are the
	// hosts its DSN lists.
	Patroni *Patroni `json:"patroni,omitempty"`
	Members []string `json:"members,omitempty"`
}

// BucketSummary is a bucket that is not plainly active.
type BucketSummary struct {
	Bucket
	Name     string      `json:"name"` // as Map.Name gives it: 5, or 5/3 at mixed depths
	Owner    NodeID      `json:"owner"`
	State    BucketState `json:"state"`
	Target   NodeID      `json:"target,omitempty"`
	Move     string      `json:"move,omitempty"`
	Since    uint64      `json:"since,omitempty"`
	DataLost bool        `json:"data_lost,omitempty"`
}

// Summary is what `shardctl status` shows.
type Summary struct {
	Version uint64 `json:"map_version"`
	// Level is every bucket's depth on a map at one depth, and absent
	// (nil) at mixed depths; MinDepth and MaxDepth are always set.
	Level     *int            `json:"level,omitempty"`
	MinDepth  int             `json:"min_depth"`
	MaxDepth  int             `json:"max_depth"`
	Buckets   int             `json:"buckets"`
	UpdatedAt time.Time       `json:"updated_at"`
	Nodes     []NodeSummary   `json:"nodes"`
	Flagged   []BucketSummary `json:"buckets_not_active"`
	History   int             `json:"history_entries"`
	Balanced  bool            `json:"balanced"`
}

// Summarize reports the map for people and scripts.
func (m *Map) Summarize() Summary {
	s := Summary{Version: m.Version, MinDepth: m.MinDepth(), MaxDepth: m.Level, Buckets: m.Buckets(), UpdatedAt: m.UpdatedAt, History: len(m.history), Flagged: []BucketSummary{}}
	if m.Uniform() {
		l := m.Level
		s.Level = &l
	}
	counts := m.Counts()
	var totalW int
	for _, n := range m.nodes {
		if n.State == NodeActive {
			totalW += n.Weight
		}
	}
	for _, n := range m.nodes {
		ns := NodeSummary{ID: n.ID, State: n.State, Weight: n.Weight, DSN: n.DSN, PoolDSN: n.PoolDSN, Password: n.Password, StreamUser: n.StreamUser, Buckets: counts[n.ID],
			Share: float64(counts[n.ID]) / float64(m.Buckets())}
		if !n.Patroni.IsZero() {
			p := n.Patroni
			ns.Patroni = &p
			ns.Members = DSNHosts(n.DSN)
		}
		if n.State == NodeActive && totalW > 0 {
			ns.FairShare = float64(n.Weight) / float64(totalW)
		}
		s.Nodes = append(s.Nodes, ns)
	}
	for _, b := range m.NonActive() {
		bm := m.MetaOf(b)
		s.Flagged = append(s.Flagged, BucketSummary{Bucket: b, Name: m.Name(b), Owner: m.OwnerOf(b), State: bm.State, Target: bm.Target, Move: bm.Move, Since: bm.Since, DataLost: bm.DataLost})
	}
	if p, err := plan(m); err == nil {
		s.Balanced = len(p.Moves)+len(p.Reassign) == 0
	}
	return s
}

// WriteSummary prints a Summary as text.
func WriteSummary(w io.Writer, s Summary) {
	if s.Level != nil {
		fmt.Fprintf(w, "map version %d, level %d (%d buckets), updated %s\n", s.Version, *s.Level, s.Buckets, s.UpdatedAt.Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "map version %d, mixed depths %d..%d (%d buckets), updated %s\n", s.Version, s.MinDepth, s.MaxDepth, s.Buckets, s.UpdatedAt.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "%-16s %-9s %6s %8s %7s %7s  %s\n", "NODE", "STATE", "WEIGHT", "BUCKETS", "SHARE", "FAIR", "DSN")
	for _, n := range s.Nodes {
		fair := "-"
		if n.FairShare > 0 {
			fair = fmt.Sprintf("%.1f%%", 100*n.FairShare)
		}
		dsn := n.DSN
		if n.PoolDSN != "" {
			dsn += "  (applications: " + n.PoolDSN + ")"
		}
		fmt.Fprintf(w, "%-16s %-9s %6d %8d %6.1f%% %7s  %s\n", n.ID, n.State, n.Weight, n.Buckets, 100*n.Share, fair, dsn)
	}
	switch {
	case s.MinDepth != s.MaxDepth:
		// Halves of a hot bucket count like whole buckets: the count
		// says little about what the nodes hold.
		fmt.Fprintf(w, "bucket counts %s; at mixed depths balance by what the nodes hold: `shardctl plan --by size`\n",
			map[bool]string{true: "within one of each node's fair share", false: "uneven"}[s.Balanced])
	case s.Balanced:
		fmt.Fprintln(w, "balanced: every active node is within one bucket of its fair share")
	default:
		fmt.Fprintln(w, "NOT balanced: `shardctl plan` shows the moves that would fix it")
	}
	if len(s.Flagged) > 0 {
		fmt.Fprintf(w, "%d buckets not plainly active:\n", len(s.Flagged))
		for i, b := range s.Flagged {
			if i == 20 {
				fmt.Fprintf(w, "  ... and %d more (see --json)\n", len(s.Flagged)-20)
				break
			}
			line := fmt.Sprintf("  bucket %s on %s: %s", b.Name, b.Owner, b.State)
			if b.State == BucketMoving {
				line += fmt.Sprintf(" to %s (move %s, since map version %d)", b.Target, b.Move, b.Since)
			}
			if b.DataLost {
				line += ", data lost (reassigned without copying)"
			}
			fmt.Fprintln(w, line)
		}
	}
	if s.History > 0 {
		fmt.Fprintf(w, "%d history entries (previous owners awaiting GC)\n", s.History)
	}
}

// Grid draws the node-by-bucket picture an operator would sketch: one
// column per node (removed ones left out), one row per bucket in key
// order, or per run of buckets when there are more than maxRows. Rows are
// named as buckets are (Name), so mixed depths show as the prefix tree
// they are: 0/3 and 1/3, then 1/2. A cell shows # where the node owns the
// whole row, the count where it owns part, > where buckets of the row are
// moving to it, and ! after a count when some of them lost their data.
func (m *Map) Grid(w io.Writer, maxRows int) {
	if maxRows <= 0 {
		maxRows = 32
	}
	var cols []int
	for i, n := range m.nodes {
		if n.State != NodeRemoved {
			cols = append(cols, i)
		}
	}
	width := 4
	for _, i := range cols {
		width = max(width, min(len(m.nodes[i].ID), 10)+1)
	}
	units := m.BucketList()
	rows := min(len(units), maxRows)
	per := (len(units) + rows - 1) / rows
	label := "bucket"
	if per > 1 {
		label = "buckets"
	}
	fmt.Fprintf(w, "%-13s", label)
	for _, i := range cols {
		id := string(m.nodes[i].ID)
		if len(id) > 10 {
			id = id[:10]
		}
		fmt.Fprintf(w, "%*s", width, id)
	}
	fmt.Fprintln(w)
	for lo := 0; lo < len(units); lo += per {
		hi := min(lo+per, len(units)) - 1
		name := m.Name(units[lo])
		if hi > lo {
			name += "-" + m.Name(units[hi])
		}
		fmt.Fprintf(w, "%-13s", name)
		own := map[int]int{}
		in := map[int]int{}
		lost := map[int]bool{}
		for _, b := range units[lo : hi+1] {
			s, _ := m.SlotsOf(b)
			o := int(m.owners[s])
			own[o]++
			if bm, ok := m.meta[s]; ok {
				if bm.State == BucketMoving {
					in[m.index[bm.Target]]++
				}
				if bm.DataLost {
					lost[o] = true
				}
			}
		}
		for _, i := range cols {
			cell := "."
			switch {
			case own[i] == hi-lo+1:
				cell = "#"
			case own[i] > 0:
				cell = fmt.Sprint(own[i])
			}
			if in[i] > 0 {
				cell = ">" + strings.TrimPrefix(cell, ".")
			}
			if lost[i] {
				cell += "!"
			}
			fmt.Fprintf(w, "%*s", width, cell)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "# owns all %d, N owns N of them, > moving in, ! data lost, . none\n", per)
}
