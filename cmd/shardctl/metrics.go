package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/internal/version"
)

// serveMetrics serves reg's metrics at addr (any path) until stop is
// called, and returns the address bound. It binds before it returns, so
// that a bad or busy --metrics-addr fails the command at once rather than
// only being logged.
func serveMetrics(flag, addr string, reg *prometheus.Registry, log *zap.Logger) (stop func(), bound string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--%s %s: %w", flag, addr, err)
	}
	_ = reg.Register(version.Collector()) // once per registry: a second is refused, harmlessly
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", zap.String("addr", addr), zap.Error(err))
		}
	}()
	log.Info("serving metrics", zap.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, ln.Addr().String(), nil
}

// serveMetricsFlag serves reg on --metrics-addr when it is set (a no-op
// stop otherwise): what every command with that flag does first.
func serveMetricsFlag(c *cli.Context, reg *prometheus.Registry, log *zap.Logger) (stop func(), err error) {
	addr := c.String("metrics-addr")
	if addr == "" {
		return func() {}, nil
	}
	stop, _, err = serveMetrics("metrics-addr", addr, reg, log)
	return stop, err
}
