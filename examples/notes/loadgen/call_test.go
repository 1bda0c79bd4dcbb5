package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// keepAliveCloser answers the first request on each connection and closes
// the connection after reading the second without answering it: what a
// client sees when a draining worker closes an idle keep-alive connection
// just as the client sends on it. It records every request's method and
// Idempotency-Key.
type keepAliveCloser struct {
	ln   net.Listener
	mu   sync.Mutex
	seen []string
}

func newKeepAliveCloser(t *testing.T, answerFirst bool) *keepAliveCloser {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &keepAliveCloser{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c, answerFirst)
		}
	}()
	return s
}

func (s *keepAliveCloser) serve(c net.Conn, answerFirst bool) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		s.mu.Lock()
		s.seen = append(s.seen, req.Method+" "+req.Header.Get("Idempotency-Key"))
		s.mu.Unlock()
		if n > 0 || !answerFirst {
			return // closed under the client, unanswered
		}
		c.Write([]byte("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"id\":1}"))
	}
}

func TestWritesAreResentWithTheSameIdempotencyKey(t *testing.T) {
	srv := newKeepAliveCloser(t, true)
	url := "http://" + srv.ln.Addr().String() + "/v1/users/u/notes"
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	st := &stats{errs: map[string]int64{}}
	if err := st.call(client, "POST", url, "one", http.StatusCreated, nil); err != nil {
		t.Fatal(err)
	}
	// The second POST goes out on the kept-alive connection, which the
	// server closes after reading it: net/http resends it on a new
	// connection because it carries an Idempotency-Key.
	if err := st.call(client, "POST", url, "two", http.StatusCreated, nil); err != nil {
		t.Fatalf("a write on a connection closed under it was not resent: %v", err)
	}
	if got := st.idleRetries.Load(); got != 1 {
		t.Fatalf("%d resends counted, want 1", got)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.seen) != 3 {
		t.Fatalf("server saw %q, want 3 requests", srv.seen)
	}
	k1, k2, k3 := srv.seen[0], srv.seen[1], srv.seen[2]
	if !strings.HasPrefix(k2, "POST ") || len(k2) < 20 || k2 != k3 || k1 == k2 {
		t.Fatalf("keys %q: each write needs its own key, kept across its resend", srv.seen)
	}
}

func TestAFreshConnectionClosedUnansweredIsAFailure(t *testing.T) {
	old := resendFor
	resendFor = 300 * time.Millisecond
	defer func() { resendFor = old }()
	srv := newKeepAliveCloser(t, false)
	client := &http.Client{Timeout: 5 * time.Second}
	st := &stats{errs: map[string]int64{}}
	// The server read the request and died, every time: the client cannot
	// know the write did not happen; it resends it with the same key while
	// resendFor lasts, and then nothing may hide the failure.
	if err := st.call(client, "POST", "http://"+srv.ln.Addr().String()+"/x", "b", http.StatusCreated, nil); err == nil {
		t.Fatal("a request the server closed unanswered on a fresh connection counted as done")
	}
	if st.idleRetries.Load() != 0 {
		t.Fatal("counted as a keep-alive resend")
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if st.resent.Load() == 0 || len(srv.seen) < 2 {
		t.Fatalf("an unanswered write was not resent: %d resends, server saw %q", st.resent.Load(), srv.seen)
	}
	for _, k := range srv.seen {
		if k != srv.seen[0] {
			t.Fatalf("resends changed the Idempotency-Key: %q", srv.seen)
		}
	}
}

// The app's 502 says the write may have committed (its db connection died
// after the statement was sent): the client resends it with the same key
// and takes the answer to the resend; a 503 (not applied) is final.
func TestAnUnknownOutcomeIsResentWithTheSameKey(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	calls := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		switch {
		case strings.HasSuffix(r.URL.Path, "/refused"):
			w.WriteHeader(http.StatusServiceUnavailable)
		case calls == 1:
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `{"error":"unexpected EOF","outcome":"unknown"}`)
		default:
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":7}`)
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	st := &stats{errs: map[string]int64{}}
	client := &http.Client{Timeout: 5 * time.Second}
	var n struct {
		ID int64 `json:"id"`
	}
	if err := st.call(client, "POST", "http://"+ln.Addr().String()+"/v1/users/u/notes", "b", http.StatusCreated, &n); err != nil || n.ID != 7 {
		t.Fatalf("after a 502: %v, id %d", err, n.ID)
	}
	mu.Lock()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] || st.resent.Load() != 1 {
		t.Fatalf("keys %q, %d resends: want one resend with the same key", keys, st.resent.Load())
	}
	calls = 5
	mu.Unlock()
	if err := st.call(client, "POST", "http://"+ln.Addr().String()+"/refused", "b", http.StatusCreated, nil); err == nil || st.resent.Load() != 1 {
		t.Fatalf("a 503 was resent or taken as done: %v, %d resends", err, st.resent.Load())
	}
}

// A write whose answer never came may have committed; one the app answered
// with an error status did not reach the ledger as either.
func TestUnansweredWrites(t *testing.T) {
	if !unanswered(errors.New("read tcp: connection reset by peer")) {
		t.Fatal("a transport error is an unanswered write")
	}
	if unanswered(&httpError{503, "refused"}) || unanswered(fmt.Errorf("wrapped: %w", &httpError{409, "conflict"})) {
		t.Fatal("an HTTP error status is an answer")
	}
	if !unanswered(&httpError{502, `{"outcome":"unknown"}`}) {
		t.Fatal("the app's 502 (outcome unknown) is not an answer")
	}
	if unanswered(nil) {
		t.Fatal("nil")
	}
}
