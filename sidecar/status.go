package sidecar

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/router"
)

// The status page (GET /) and the view it shows (GET /v1/status).

//go:embed status.html
var statusPage []byte

// statusPageCSP lets the status page run its own inline script (by hash)
// and fetch from this origin, and nothing else: no other script, no
// inline event handler, no image, frame or form. Values from records are
// put into the page as text; this is the second line of defence.
var statusPageCSP = func() string {
	_, rest, ok := bytes.Cut(statusPage, []byte("<script>"))
	script, _, ok2 := bytes.Cut(rest, []byte("</script>"))
	if !ok || !ok2 {
		panic("sidecar: status.html has no <script> element")
	}
	sum := sha256.Sum256(script)
	return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

// page serves the status page; it fetches its data from /v1/status.
func (h *handler) page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", statusPageCSP)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Write(statusPage)
}

// StatusView is what the status page shows (GET /v1/status).
type StatusView struct {
	Cluster    string                  `json:"cluster"`
	Source     router.Source           `json:"source"`
	ZKState    string                  `json:"zk_state"`
	MapVersion uint64                  `json:"map_version"`
	Level      int                     `json:"level"` // the deepest bucket's depth; every bucket's at one depth
	MinDepth   int                     `json:"min_depth"`
	Buckets    int                     `json:"buckets"`
	AppliedAt  time.Time               `json:"applied_at"`
	Nodes      []bucketmap.NodeSummary `json:"nodes"`
	// Cells is the grid: one per bucket in key order, or per run of
	// PerCell buckets when there are more than maxCells. Each is [owner
	// index, moving buckets, data-lost buckets], owner being the
	// majority owner; Labels names each cell's buckets as shardctl does
	// ("5", "4-7", at mixed depths "0/3" or "0/3-1/2").
	PerCell  int                       `json:"per_cell"`
	Cells    [][3]int                  `json:"cells"`
	Labels   []string                  `json:"labels"`
	InFlight []bucketmap.BucketSummary `json:"in_flight"`
	Balanced bool                      `json:"balanced"`
	Error    string                    `json:"last_error,omitempty"`
	// Groups are the Patroni groups among the nodes, as their records
	// say now (the sidecar's handler fills it; Status leaves it empty).
	Groups map[bucketmap.NodeID]*GroupView `json:"groups,omitempty"`
	// Pools are the poolers of the nodes that have one, as their admin
	// consoles say (read at most every 10 s; the handler fills it).
	Pools map[bucketmap.NodeID]*PoolView `json:"pools,omitempty"`
}

const maxCells = 1024

// Status builds the status page's data from r's map.
func Status(r *router.Router) (*StatusView, error) {
	applied := r.Applied()
	if len(applied) == 0 {
		return nil, router.ErrNotReady
	}
	cur := applied[len(applied)-1]
	m, cluster, at := cur.Map, cur.Cluster, cur.At
	sum := m.Summarize()
	v := &StatusView{Cluster: cluster, Source: r.Source(), ZKState: r.ZKState().String(), MapVersion: m.Version, Level: m.Level, MinDepth: m.MinDepth(),
		Buckets: m.Buckets(), AppliedAt: at, Nodes: sum.Nodes, Balanced: sum.Balanced, InFlight: []bucketmap.BucketSummary{}}
	if e := r.Stats().LastError.Load(); e != nil {
		v.Error = *e
	}
	// The flagged buckets are the only ones that are moving or lost.
	flagged := make(map[bucketmap.Bucket]bucketmap.BucketSummary, len(sum.Flagged))
	for _, b := range sum.Flagged {
		flagged[b.Bucket] = b
		if b.State == bucketmap.BucketMoving {
			v.InFlight = append(v.InFlight, b)
		}
	}
	units := m.BucketList()
	v.PerCell = max(1, (len(units)+maxCells-1)/maxCells)
	counts := make([]int, len(m.Nodes()))
	for lo := 0; lo < len(units); lo += v.PerCell {
		clear(counts)
		moving, lost := 0, 0
		hi := min(lo+v.PerCell, len(units)) - 1
		label := m.Name(units[lo])
		if hi > lo {
			label += "-" + m.Name(units[hi])
		}
		v.Labels = append(v.Labels, label)
		for _, b := range units[lo : hi+1] {
			slot, _ := m.SlotsOf(b)
			counts[m.OwnerIndex(slot)]++
			if bm, ok := flagged[b]; ok {
				if bm.State == bucketmap.BucketMoving {
					moving++
				}
				if bm.DataLost {
					lost++
				}
			}
		}
		best := 0
		for i, c := range counts {
			if c > counts[best] {
				best = i
			}
		}
		v.Cells = append(v.Cells, [3]int{best, moving, lost})
	}
	return v, nil
}

func (h *handler) status(w http.ResponseWriter, _ *http.Request) {
	v, err := Status(h.r)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	v.Groups = h.groupCache.get(h.r.Map())
	v.Pools = h.poolCache.get(h.r.Map())
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
