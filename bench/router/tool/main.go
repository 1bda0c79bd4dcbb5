// Command tool supports bench/router/run: it writes a map file for the
// benchmark and serves the baseline (a minimal Go HTTP handler returning a
// constant), so that the router is measured against the same machine in
// the same run.
package main

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/shardvisor/shardvisor/bucketmap"
)

func main() {
	switch a := os.Args[1:]; {
	case len(a) == 4 && a[0] == "mkmap":
		level, _ := strconv.Atoi(a[2])
		n, _ := strconv.Atoi(a[3])
		var nodes []bucketmap.Node
		for i := range n {
			nodes = append(nodes, bucketmap.Node{ID: bucketmap.NodeID(fmt.Sprintf("pg%d", i+1)), DSN: fmt.Sprintf("postgres://app@10.0.%d.%d:5432/app", i/250, i%250+1), Weight: 1, State: bucketmap.NodeActive})
		}
		m, err := bucketmap.New(level, nodes, time.Now())
		must(err)
		raw, err := bucketmap.Encode(m)
		must(err)
		doc, err := bucketmap.EncodeMapFile("bench", "5eed0000000000000000000000000001", raw)
		must(err)
		must(os.WriteFile(a[1], doc, 0o644))
	case len(a) == 2 && a[0] == "const":
		// The same shape of answer as the router's, without any work.
		body := []byte(`{"uid":"user-1","bucket":4,"level":16,"node":"pg1","dsn":"postgres://app@10.0.0.1:5432/app","map_version":1,"state":"active","data_lost":false,"suspended":false,"stale":false,"moved":false}` + "\n")
		must(http.ListenAndServe(a[1], http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(body)
		})))
	default:
		fmt.Fprintln(os.Stderr, "usage: tool mkmap FILE LEVEL NODES | tool const ADDR")
		os.Exit(2)
	}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
