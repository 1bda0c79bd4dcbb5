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
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	log.SetPrefix(fmt.Sprintf("hello[%d] ", os.Getpid()))
	if d, err := time.ParseDuration(os.Getenv("HELLO_STARTUP_DELAY")); err == nil {
		time.Sleep(d)
	}
	ln, err := inheritedListener()
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
	var mu sync.Mutex
	fresh := map[net.Conn]bool{} // accepted, first request not read yet
	srv := &http.Server{
		ConnState: func(c net.Conn, st http.ConnState) {
			mu.Lock()
			defer mu.Unlock()
			if st == http.StateNew {
				fresh[c] = true
			} else {
				delete(fresh, c)
			}
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s from pid %d generation %s map %s\n", greeting, os.Getpid(), gen, mapVersion)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	done, served := make(chan struct{}), make(chan struct{})
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		notify("STOPPING=1")
		// net/http's Shutdown drops connections that were accepted but
		// whose first request it reads after Shutdown began. Under the
		// supervisor the socket stays open for the other workers, so stop
		// accepting first, let accepted connections deliver their request,
		// then Shutdown (which waits for in-flight requests).
		ln.Close()
		<-served // Serve has returned: every accepted connection is registered
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			mu.Lock()
			n := len(fresh)
			mu.Unlock()
			if n == 0 {
				break
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		close(done)
	}()
	go watchdog()
	notify("READY=1")
	err = srv.Serve(ln)
	close(served)
	select {
	case <-done:
	default:
		if err != nil && !errors.Is(err, net.ErrClosed) {
			log.Fatal(err)
		}
	}
	<-done
}

// inheritedListener returns the first socket passed by LISTEN_FDS (fd 3),
// or listens on $HELLO_ADDR (default 127.0.0.1:8080) when run by hand.
func inheritedListener() (net.Listener, error) {
	if os.Getenv("LISTEN_PID") == strconv.Itoa(os.Getpid()) {
		if n, _ := strconv.Atoi(os.Getenv("LISTEN_FDS")); n > 0 {
			name := strings.Split(os.Getenv("LISTEN_FDNAMES"), ":")[0]
			f := os.NewFile(3, name)
			defer f.Close() // FileListener dups it
			return net.FileListener(f)
		}
	}
	addr := os.Getenv("HELLO_ADDR")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	return net.Listen("tcp", addr)
}

// notify is sd_notify(3): one datagram to NOTIFY_SOCKET ('@' = abstract).
func notify(state string) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		log.Printf("sd_notify: %v", err)
		return
	}
	defer c.Close()
	_, _ = c.Write([]byte(state))
}

// watchdog sends WATCHDOG=1 at half the interval the supervisor asked for.
func watchdog() {
	usec, _ := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if usec <= 0 || os.Getenv("WATCHDOG_PID") != strconv.Itoa(os.Getpid()) {
		return
	}
	t := time.NewTicker(time.Duration(usec) * time.Microsecond / 2)
	for range t.C {
		notify("WATCHDOG=1")
	}
}
