package supervisor

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/shardvisor/shardvisor/internal/pki"
)

// tlsFiles makes a CA and the named web head identities in a temp dir.
func tlsFiles(t *testing.T, names ...string) map[string]pki.Files {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]pki.Files{}
	for _, n := range names {
		f := pki.FilesIn(dir, n)
		if err := ca.Write(f.CA, dir+"/ca.key"); err != nil {
			t.Fatal(err)
		}
		leaf, err := ca.Issue(pki.Identity{Role: "webhead", Host: n, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := leaf.Write(f.Cert, f.Key); err != nil {
			t.Fatal(err)
		}
		out[n] = f
	}
	return out
}

// With AdminTLS the fail-static question travels over TLS with both
// sides' certificates: a peer that asks over plain HTTP, or without a
// certificate of the fleet's CA, gets no answer to forge from.
func TestPeerQuestionOverTLS(t *testing.T) {
	files := tlsFiles(t, "a", "b")
	cfgA, err := files["a"].Config()
	if err != nil {
		t.Fatal(err)
	}
	cfgB, err := files["b"].Config()
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("fleet secret, at least 16 bytes")
	A, B := peerID{"web", "a"}, peerID{"web", "b"}
	svB := &Supervisor{opts: Options{Pool: B.Pool, Member: B.Member, PeerSecret: secret, AdminTLS: cfgB}}
	svB.snap.State = "lost"
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(svB.servePeer)}
	go srv.Serve(tls.NewListener(raw, svB.opts.AdminTLS))
	t.Cleanup(func() { srv.Close() })
	adminB := raw.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	tlsClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: cfgA}}
	if a, err := askPeer(ctx, peerHTTP{tlsClient, "https://"}, adminB, A, B, secret); err != nil || a.Member != "b" {
		t.Fatalf("over TLS: %+v %v", a, err)
	}
	if _, err := askPeer(ctx, peerHTTP{&http.Client{}, "http://"}, adminB, A, B, secret); err == nil {
		t.Fatal("a plain HTTP question was answered")
	}
	noCert := cfgA.Clone()
	noCert.Certificates = nil
	if _, err := askPeer(ctx, peerHTTP{&http.Client{Transport: &http.Transport{TLSClientConfig: noCert}}, "https://"}, adminB, A, B, secret); err == nil {
		t.Fatal("a question without a client certificate was answered")
	}
}

// With AdminTLS every admin endpoint takes HTTPS only, from a client with
// a certificate of the CA: /status and /metrics tell an attacker the
// fleet's layout, and /healthz is what takes a host out of service.
func TestAdminOverTLS(t *testing.T) {
	files := tlsFiles(t, "sv", "scraper")
	svCfg, err := files["sv"].Config()
	if err != nil {
		t.Fatal(err)
	}
	sv := adminOnlyTLS(t, svCfg)
	defer sv.stopAdmin()
	addr := sv.AdminAddr()
	scraper, err := files["scraper"].Config()
	if err != nil {
		t.Fatal(err)
	}
	with := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: scraper}}
	for _, path := range []string{"/status", "/metrics", "/healthz", "/livez"} {
		resp, err := with.Get("https://" + addr + path)
		if err != nil {
			t.Fatalf("%s with a certificate: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 && resp.StatusCode != 503 {
			t.Errorf("%s with a certificate: HTTP %d", path, resp.StatusCode)
		}
	}
	noCert := scraper.Clone()
	noCert.Certificates = nil
	for name, c := range map[string]*http.Client{
		"plain HTTP":     {Timeout: 5 * time.Second},
		"no certificate": {Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: noCert}},
	} {
		scheme := "https://"
		if name == "plain HTTP" {
			scheme = "http://"
		}
		if resp, err := c.Get(scheme + addr + "/status"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Errorf("%s: /status answered 200", name)
			}
		}
	}
}

// A plain fleet's client asks over HTTP on every question, not only the
// first: net/http fills in a transport's TLS configuration on first use,
// and reading the scheme off it sent the second question as HTTPS (the
// fault run of CI 11: "server gave HTTP response to HTTPS client").
func TestPlainPeerQuestionsStayHTTP(t *testing.T) {
	secret := []byte("fleet secret, at least 16 bytes")
	_, admin := peerHost(t, "web", "b", secret)
	c := newPeerHTTP(nil, nil)
	for i := range 3 {
		if _, err := askPeer(context.Background(), c, admin, peerID{"web", "a"}, peerID{"web", "b"}, secret); err != nil {
			t.Fatalf("question %d: %v", i+1, err)
		}
	}
}

// With the reloading configurations the supervisor binary uses
// (pki.Files.Reloading), a rotation of the fleet's CA and certificates on
// disk is taken by the next question, both as server and as client, with
// no restart (issue 41); a client still holding the old files' contents
// is refused.
func TestPeerQuestionOverTLSAfterRotation(t *testing.T) {
	files := tlsFiles(t, "a", "b")
	oldA, err := files["a"].Config()
	if err != nil {
		t.Fatal(err)
	}
	_, clientA, err := files["a"].Reloading()
	if err != nil {
		t.Fatal(err)
	}
	serverB, _, err := files["b"].Reloading()
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("fleet secret, at least 16 bytes")
	A, B := peerID{"web", "a"}, peerID{"web", "b"}
	svB := &Supervisor{opts: Options{Pool: B.Pool, Member: B.Member, PeerSecret: secret, AdminTLS: serverB}}
	svB.snap.State = "lost"
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(svB.servePeer)}
	go srv.Serve(tls.NewListener(raw, serverB))
	t.Cleanup(func() { srv.Close() })
	adminB := raw.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	asker := newPeerHTTP(nil, clientA)
	if a, err := askPeer(ctx, asker, adminB, A, B, secret); err != nil || a.Member != "b" {
		t.Fatalf("before the rotation: %+v %v", a, err)
	}
	// The rotation: a new CA and new certificates, renamed over the old
	// files of both hosts.
	time.Sleep(10 * time.Millisecond)
	next := tlsFiles(t, "a", "b")
	for _, n := range []string{"a", "b"} {
		for _, p := range [][2]string{{next[n].CA, files[n].CA}, {next[n].Cert, files[n].Cert}, {next[n].Key, files[n].Key}} {
			b, err := os.ReadFile(p[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p[1]+".new", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(p[1]+".new", p[1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if a, err := askPeer(ctx, asker, adminB, A, B, secret); err != nil || a.Member != "b" {
		t.Fatalf("after the rotation, with the configurations made before it: %+v %v", a, err)
	}
	old := peerHTTP{&http.Client{Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: oldA}}, "https://"}
	if _, err := askPeer(ctx, old, adminB, A, B, secret); err == nil {
		t.Fatal("a peer with the certificates rotated away was answered")
	}
}
