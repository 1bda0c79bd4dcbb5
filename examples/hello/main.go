// Command hello is the smallest useful shardvisor worker: an HTTP server on
// the socket inherited from the supervisor (LISTEN_FDS), that reports
// READY=1 once it is serving, answers watchdog keep-alives, reads the
// bucket map file the supervisor hands it (following it in place in the
// supervisor's reload mode), and drains on SIGTERM.
//
// It uses only the standard library, to show that the protocols are small:
// any systemd-aware server works under the supervisor unmodified.
//
// Environment: HELLO_STARTUP_DELAY (e.g. "1.5s") sleeps before serving, to
// imitate a framework warming up; GREETING changes the greeting.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/shardvisor/shardvisor/worker"
)

func main() {
	log.SetPrefix(fmt.Sprintf("hello[%d] ", os.Getpid()))
	if d, err := time.ParseDuration(os.Getenv("HELLO_STARTUP_DELAY")); err == nil {
		time.Sleep(d)
	}
	addr := os.Getenv("HELLO_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	ln, err := worker.Listener(addr)
	if err != nil {
		log.Fatal(err)
	}
	// The map version it routes by: in the supervisor's reload mode the
	// map file is replaced in place, and worker.FollowMap reloads it and
	// acknowledges each version.
	var mapVersion atomic.Uint64
	mapVersion.Store(parseUint(os.Getenv("SHARDVISOR_MAP_VERSION")))
	if f := os.Getenv("SHARDVISOR_MAP_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			log.Fatalf("bucket map: %v", err)
		}
		log.Printf("bucket map version %d, %d bytes", mapVersion.Load(), len(b))
		worker.FollowMap(context.Background(), mapVersion.Load(), func(data []byte) (uint64, error) {
			// Only the version: a real app would route with the map
			// (router.FromWorkerEnv does all of this for Go apps).
			var doc struct {
				Map struct {
					Version uint64 `json:"map_version"`
				} `json:"map"`
			}
			if err := json.Unmarshal(data, &doc); err != nil || doc.Map.Version == 0 {
				return 0, fmt.Errorf("map file %s: no map_version (%v)", f, err)
			}
			mapVersion.Store(doc.Map.Version)
			return doc.Map.Version, nil
		}, func(err error) { log.Printf("bucket map: %v", err) })
	}
	greeting := os.Getenv("GREETING")
	if greeting == "" {
		greeting = "hello"
	}
	gen := os.Getenv("SHARDVISOR_GENERATION")
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s from pid %d generation %s map %d\n", greeting, os.Getpid(), gen, mapVersion.Load())
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	// worker.Serve says READY=1, answers the watchdog, and drains on
	// SIGTERM without dropping a request.
	if err := worker.Serve(srv, ln, 25*time.Second); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		log.Fatal(err)
	}
}

func parseUint(s string) uint64 {
	v, _ := strconv.ParseUint(s, 10, 64)
	return v
}
