package clustertest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shardvisor/shardvisor/internal/benchkit"
	"github.com/shardvisor/shardvisor/internal/devenv"
	"github.com/shardvisor/shardvisor/internal/pki"
	"github.com/shardvisor/shardvisor/zksession"
)

// A benchmark on a TLS dev environment (SHARDVISOR_DEVENV_TLS=1,
// internal/devenv's tls.go) dials ZooKeeper over TLS with the identities
// devenv issued in DIR/tls: the admin's for its own session (it creates
// the cluster and moves buckets, as an operator and the mover do), a web
// head's for its router, as production separates them.
const (
	Admin   = "admin"   // CN=operator,OU=admin,O=shardvisor
	WebHead = "webhead" // CN=web1,OU=webhead,O=shardvisor
)

// DevTLS is cfg as identity on the ensemble of the dev environment in
// dir: unchanged (plain TCP) unless tls, else with its TLS dialer and its
// x509 identity (the owner of the member records the session creates).
func DevTLS(cfg zksession.Config, dir string, tls bool, identity string) (zksession.Config, error) {
	if !tls {
		return cfg, nil
	}
	files := devenv.New(devenv.Config{Dir: dir}).TLSFiles(identity)
	tc, err := files.Config()
	if err == nil {
		cfg.Dial = pki.Dialer(tc)
		cfg.Identity, err = files.SubjectDN()
	}
	if err != nil {
		return cfg, fmt.Errorf("ZooKeeper identity %s of the TLS environment in %s (SHARDVISOR_DEVENV_TLS=1 scripts/devenv up makes it): %w", identity, dir, err)
	}
	return cfg, nil
}

// DevSSL is the TLS query of the DSNs of the dev environment in dir:
// sslmode=disable plain; with tls, its servers take TCP over TLS only and
// the DSNs verify them against its CA.
func DevSSL(dir string, tls bool) string {
	return devenv.New(devenv.Config{Dir: dir, TLS: tls}).PGSSLParams()
}

// SessionAs opens another session on the Dev's ensemble, as identity when
// it is TLS (a plain one otherwise): the router's, say.
func (d *Dev) SessionAs(ctx context.Context, identity string) (*zksession.Session, error) {
	cfg, err := DevTLS(zksession.Config{Connect: d.sp.ZK}, d.sp.Dir, d.sp.TLS, identity)
	if err != nil {
		return nil, err
	}
	return OpenSessionWith(ctx, cfg, "scripts/devenv up (--plain for a plain benchmark)")
}

// CompareEnvs are the two environments of a benchmark's side-by-side TLS
// comparison (issue 38), alike but for TLS: the plain one as
// devenv.FromEnv reads it (SHARDVISOR_DEVENV_DIR, the port bases, the
// nodes), and the TLS one in SHARDVISOR_BENCH_TLS_DIR (default: the plain
// one's directory + "-tls") on SHARDVISOR_BENCH_TLS_ZK_PORT_BASE and
// SHARDVISOR_BENCH_TLS_PG_PORT_BASE (default: the plain one's ports: the
// plain environment is down before the TLS one starts).
func CompareEnvs() (plain, tls devenv.Config, err error) {
	if plain, err = devenv.FromEnv(); err != nil {
		return plain, tls, err
	}
	plain.TLS = false
	plain = devenv.New(plain).Config() // its defaults, to derive the TLS one's
	tls = plain
	tls.TLS = true
	tls.Dir = plain.Dir + "-tls"
	if v := os.Getenv("SHARDVISOR_BENCH_TLS_DIR"); v != "" {
		tls.Dir = v
	}
	for v, port := range map[string]*int{"SHARDVISOR_BENCH_TLS_ZK_PORT_BASE": &tls.ZKPortBase, "SHARDVISOR_BENCH_TLS_PG_PORT_BASE": &tls.PGPortBase} {
		if s := os.Getenv(v); s != "" {
			if *port, err = strconv.Atoi(s); err != nil {
				return plain, tls, fmt.Errorf("%s: not a port: %q", v, s)
			}
		}
	}
	return plain, tls, nil
}

// CompareTLS runs a benchmark in both modes with the same parameters,
// rounds times (at least once), each run on an environment of its own
// brought up before it and down after it (keep: the last one stays up, or
// the one whose run failed). The rounds alternate which mode goes first:
// plain then TLS, TLS then plain, ... (with SHARDVISOR_BENCH_TLS_FIRST=1
// the other way round), so that an order effect (the first run's
// writeback still under way in the second, say) falls on both modes. A
// run that fails ends the comparison: the rounds that finished are
// returned, and the failed one apart, with the summaries it has.
func CompareTLS[S any](keep bool, rounds int, run func(e *devenv.Env) (*S, error)) (done []benchkit.Round[S], failed *benchkit.Round[S], err error) {
	pc, tc, err := CompareEnvs()
	if err != nil {
		return nil, nil, err
	}
	rounds = max(rounds, 1)
	tlsFirst := os.Getenv("SHARDVISOR_BENCH_TLS_FIRST") == "1"
	for i := range rounds {
		r := benchkit.Round[S]{TLSFirst: tlsFirst != (i%2 == 1)}
		for k, tls := range []bool{r.TLSFirst, !r.TLSFirst} {
			cfg, slot, mode := pc, &r.Plain, "plain"
			if tls {
				cfg, slot, mode = tc, &r.TLS, "TLS"
			}
			last := i == rounds-1 && k == 1
			if *slot, err = inDevenv(cfg, keep, last, run); err != nil {
				return done, &r, fmt.Errorf("round %d, %s mode: %w", i+1, mode, err)
			}
		}
		done = append(done, r)
	}
	return done, nil, nil
}

// inDevenv brings the environment cfg up, runs f on it and brings it down
// again, unless keep and it is the last run or a failed one (kept to look
// at).
func inDevenv[S any](cfg devenv.Config, keep, last bool, f func(e *devenv.Env) (*S, error)) (*S, error) {
	cfg.Log = os.Stderr
	e := devenv.New(cfg)
	fmt.Fprintf(os.Stderr, "== environment %s (TLS %v): up\n", e.Dir(), cfg.TLS)
	var s *S
	err := e.Up()
	if err != nil && !keep {
		// A port of the new environment held by another connection (one
		// in TIME_WAIT, with a port base in the ephemeral range) fails its
		// up now and then: once more after TIME_WAIT's 60 s.
		fmt.Fprintf(os.Stderr, "== environment %s: up failed (%s); down, and up again in 60 s\n", e.Dir(), strings.SplitN(err.Error(), "\n", 2)[0])
		_ = e.Down()
		time.Sleep(60 * time.Second)
		err = e.Up()
	}
	if err == nil {
		s, err = f(e)
	}
	if !keep || !last && err == nil { // after a failed up too: what it started
		if derr := e.Down(); derr != nil {
			fmt.Fprintf(os.Stderr, "== environment %s: down: %v\n", e.Dir(), derr)
		}
	} else {
		fmt.Fprintf(os.Stderr, "== environment %s: kept (scripts/devenv down with SHARDVISOR_DEVENV_DIR=%s stops it)\n", e.Dir(), e.Dir())
	}
	return s, err
}

// CompareMain is a benchmark's main under --compare-tls: CompareTLS (rounds
// of it: --rounds), each
// run's report as it ends, then figs compared (benchkit.Comparison) and,
// with --json, the whole on stdout. It exits 1 when a run failed or a
// check (no acknowledged write lost, say) failed in either run; a ratio
// over its goal is reported, not an exit status, as other work on the
// machine shows in it.
func CompareMain[S any](name string, out *benchkit.Out, keep bool, rounds int, figs []benchkit.Figure, run func(e *devenv.Env) (*S, error), report func(*S)) {
	c := &benchkit.Comparison[S]{}
	rs, failed, err := CompareTLS(keep, rounds, func(e *devenv.Env) (*S, error) {
		mode := map[bool]string{false: "plain", true: "TLS"}[e.Config().TLS]
		out.Say("\n== %s mode (%s)", mode, e.Dir())
		s, err := run(e)
		if s != nil {
			report(s)
		}
		c.LoadAvg = append(c.LoadAvg, mode+" "+benchkit.LoadAvg(3))
		return s, err
	})
	switch {
	case len(rs) > 0:
		c.Plain, c.TLS, c.TLSFirst, c.More, c.Failed = rs[0].Plain, rs[0].TLS, rs[0].TLSFirst, rs[1:], failed
	case failed != nil: // the first round failed: what it has, as before rounds
		c.Plain, c.TLS, c.TLSFirst = failed.Plain, failed.TLS, failed.TLSFirst
	}
	c.Conclude(name, figs, err, &out.Printer, *out.JSON)
}
