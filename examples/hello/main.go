// Command hello is the smallest useful shardvisor worker: an HTTP server on
// the socket inherited from the supervisor (LISTEN_FDS), that reports
// READY=1 once it is serving, answers watchdog keep-alives, reads the
// bucket map file the supervisor hands it, and drains on SIGTERM.
//
// It uses only the standard library, to show that the protocols are small:
// any systemd-aware server works under the supervisor unmodified.
//
// Environment: HELLO_STARTUP_DELAY (e.g. "1.5s") sleeps before serving, to
// imitate a framework warming up; GREETING changes the greeting.
package main

import (
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
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
	mapVersion := os.Getenv("SHARDVISOR_MAP_VERSION")
	if f := os.Getenv("SHARDVISOR_MAP_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			log.Fatalf("bucket map: %v", err)
		}
		log.Printf("bucket map version %s, %d bytes", mapVersion, len(b))
	}
	greeting := os.Getenv("GREETING")
	if greeting == "" {
		greeting = "hello"
	}
	gen := os.Getenv("SHARDVISOR_GENERATION")
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s from pid %d generation %s map %s\n", greeting, os.Getpid(), gen, mapVersion)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	// worker.Serve says READY=1, answers the watchdog, and drains on
	// SIGTERM without dropping a request.
	if err := worker.Serve(srv, ln, 25*time.Second); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		log.Fatal(err)
	}
}
