// Command router is the routing sidecar: it follows a cluster's bucket map
// (from ZooKeeper, or from a map file) and answers "which db node holds
// this user" over HTTP for apps in any language. See docs/router-api.md.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/fleet"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/sidecar"
	"github.com/shardvisor/shardvisor/zksession"
)

func main() {
	cliutil.Run(newApp())
}

func newApp() *cli.App {
	host, _ := os.Hostname()
	defID := strings.Trim(regexp.MustCompile(`[^a-z0-9_-]+`).ReplaceAllString(strings.ToLower(host), "-"), "-")
	if defID == "" {
		defID = "router"
	}
	defID = fmt.Sprintf("%s-%d", defID, os.Getpid())
	return &cli.App{
		Name:  "router",
		Usage: "answer \"which db node holds this user\" over HTTP, from the watched bucket map",
		Flags: append(append(cliutil.ZKFlags(), cliutil.OutputFlags("info")...),
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8484", EnvVars: []string{"SHARDVISOR_ROUTER_LISTEN"}, Usage: "`address` to serve on: host:port or unix:/path"},
			&cli.BoolFlag{Name: "allow-public", EnvVars: []string{"SHARDVISOR_ROUTER_ALLOW_PUBLIC"}, Usage: "allow a non-loopback --listen address without TLS (the API then has no authentication, and the seed and DSNs travel in clear)"},
			&cli.StringFlag{Name: "tls-ca", EnvVars: []string{"SHARDVISOR_ROUTER_TLS_CA"}, Usage: "serve HTTPS, taking only client certificates of this CA `file` (PEM); with --tls-cert and --tls-key, a non-loopback --listen needs no --allow-public. The files are read again when they change"},
			&cli.StringFlag{Name: "tls-cert", EnvVars: []string{"SHARDVISOR_ROUTER_TLS_CERT"}, Usage: "the router's certificate `file` (PEM) for HTTPS"},
			&cli.StringFlag{Name: "tls-key", EnvVars: []string{"SHARDVISOR_ROUTER_TLS_KEY"}, Usage: "the router's key `file` (PEM) for HTTPS"},
			&cli.StringFlag{Name: "map-file", EnvVars: []string{"SHARDVISOR_ROUTER_MAP_FILE"}, Usage: "serve from this map `file` instead of ZooKeeper"},
			&cli.StringFlag{Name: "id", Value: defID, EnvVars: []string{"SHARDVISOR_ROUTER_ID"}, Usage: "member `id` registered in ZooKeeper with the applied map version"},
			&cli.IntFlag{Name: "max-batch", Value: sidecar.DefaultMaxBatch, EnvVars: []string{"SHARDVISOR_ROUTER_MAX_BATCH"}, Usage: "user ids allowed in one POST /v1/route"},
		),
		Action: run,
	}
}

func run(c *cli.Context) error {
	log, err := cliutil.Logger(c)
	if err != nil {
		return err
	}
	defer log.Sync()
	var tlsCfg *tls.Config
	if f := (pki.Files{CA: c.String("tls-ca"), Cert: c.String("tls-cert"), Key: c.String("tls-key")}); f != (pki.Files{}) {
		if tlsCfg, err = f.ReloadingServerConfig(); err != nil {
			return cliutil.Usagef("--tls-ca, --tls-cert, --tls-key: %v", err)
		}
	}
	// With TLS every client proves who it is with a certificate of the
	// CA: the API may then listen beyond loopback.
	ln, err := sidecar.Listen(c.String("listen"), c.Bool("allow-public") || tlsCfg != nil)
	if err != nil {
		return cliutil.Usagef("%v", err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	var r *router.Router
	var (
		fleetStatus *fleet.Status
		memberID    string // a router from a map file registers no member
		session     *zksession.Session
	)
	if f := c.String("map-file"); f != "" {
		if r, err = router.NewFromFile(f, router.Options{Logger: log}); err != nil {
			return err
		}
		log.Info("serving from a map file", zap.String("file", f), zap.Uint64("map_version", r.Map().Version))
	} else {
		// The sidecar starts even when ZooKeeper is down: /readyz says
		// not ready until the first map arrives.
		s, paths, err := cliutil.Open(c, log)
		if err != nil {
			return err
		}
		defer s.Close()
		memberID = c.String("id")
		r = router.New(s, paths, router.Options{Logger: log, MemberID: memberID, MemberAddr: ln.Addr().String()})
		fleetStatus = fleet.NewStatus(s, paths, fleet.StatusOptions{Logger: log.With(zap.String("component", "router"))})
		session = s
	}
	defer r.Close()
	srv := &http.Server{Handler: sidecar.Handler(r, sidecar.HandlerOptions{MaxBatch: c.Int("max-batch"), Fleet: fleetStatus, MemberID: memberID, Session: session}), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("router listening", zap.String("addr", ln.Addr().String()), zap.String("source", string(r.Source())))
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	case <-ctx.Done():
		log.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}
	return nil
}
