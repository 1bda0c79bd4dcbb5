package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/hint"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

// poolArg is the one pool name that pool status and get take.
func poolArg(c *cli.Context) (string, error) {
	if c.Args().Len() != 1 {
		return "", cliutil.Usagef("pool %s: give exactly one pool name", c.Command.Name)
	}
	name := c.Args().First()
	if err := topo.ValidName("pool", name); err != nil {
		return "", cliutil.Usagef("%v", err)
	}
	return name, nil
}

type poolStatusReport struct {
	Pool          string             `json:"pool"`
	ConfigPath    string             `json:"config_path"`
	ConfigVersion *int32             `json:"config_version"` // nil: no config
	ConfigError   string             `json:"config_error,omitempty"`
	LastSwap      *topo.PoolStatus   `json:"last_swap"`
	Members       []*topo.PoolMember `json:"members"`
	MemberErrors  []string           `json:"member_errors,omitempty"`
}

func runPoolStatus(c *cli.Context) error {
	pool, err := poolArg(c)
	if err != nil {
		return err
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
		ps, err := topo.ReadPoolState(ctx, st.Session(), st.Paths(), pool)
		if err != nil {
			return err
		}
		rep := poolStatusReport{Pool: pool, ConfigPath: ps.ConfigPath, ConfigVersion: ps.ConfigVersion, LastSwap: ps.Status, Members: []*topo.PoolMember{}}
		if ps.ConfigErr != nil {
			rep.ConfigError = ps.ConfigErr.Error()
		}
		for _, m := range ps.Members {
			if m.Err != nil {
				rep.MemberErrors = append(rep.MemberErrors, m.Err.Error())
				continue
			}
			rep.Members = append(rep.Members, m.Rec)
		}
		return cliutil.NewPrinter(c).Emit(rep, func(w io.Writer) {
			if rep.ConfigVersion == nil {
				fmt.Fprintf(w, "pool %s: no config at %s (create it with `shardctl pool set %s --file config.json`)\n", pool, rep.ConfigPath, pool)
			} else {
				fmt.Fprintf(w, "pool %s: config version %d at %s\n", pool, *rep.ConfigVersion, rep.ConfigPath)
			}
			if rep.ConfigError != "" {
				fmt.Fprintf(w, "  config is INVALID: %s\n", rep.ConfigError)
			}
			if st := rep.LastSwap; st != nil {
				fmt.Fprintf(w, "last swap: %s by %s at %s: generation %d, config %d, map %d", st.Result, st.Member, st.At.Format("2006-01-02T15:04:05Z07:00"), st.Generation, st.ConfigVersion, st.MapVersion)
				if st.SwapSeconds > 0 {
					fmt.Fprintf(w, ", took %.2fs", st.SwapSeconds)
				}
				if st.Error != "" {
					fmt.Fprintf(w, "\n  error: %s", st.Error)
				}
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "%d member(s)\n", len(rep.Members))
			if len(rep.Members) > 0 {
				fmt.Fprintf(w, "  %-24s %-18s %-9s %-6s %-4s %-7s %-5s %s\n", "MEMBER", "HOST", "STATE", "PID", "GEN", "CONFIG", "MAP", "WORKERS (ready/target, starting, stopping)")
			}
			for _, m := range rep.Members {
				cnt := map[string]int{}
				for _, wk := range m.Workers {
					cnt[wk.State]++
				}
				fmt.Fprintf(w, "  %-24s %-18s %-9s %-6d %-4d %-7d %-5d %d/%d, %d, %d\n", m.Member, m.Host, m.State, m.PID, m.Generation, m.ConfigVersion, m.MapVersion,
					cnt["ready"], m.Target, cnt["starting"], cnt["stopping"])
				if m.LastError != "" {
					fmt.Fprintf(w, "    last error: %s\n", m.LastError)
				}
				if fs := m.FailStatic; fs != nil {
					if fs.Until.IsZero() {
						fmt.Fprintf(w, "    FAIL-STATIC since %s (%d peers agreed): ZooKeeper unreachable for the fleet, serving the last config and map\n", fs.Since.Format(time.RFC3339), fs.Peers)
					} else {
						fmt.Fprintf(w, "    last fail-static episode: %s to %s (%s, %d peers agreed)\n", fs.Since.Format(time.RFC3339), fs.Until.Format(time.RFC3339),
							fs.Until.Sub(fs.Since).Round(time.Second), fs.Peers)
					}
				}
				if rb := m.RolledBack; rb != nil {
					fmt.Fprintf(w, "    rolled back config %d to %d at %s: %s\n", rb.ConfigVersion, rb.ToConfigVersion, rb.At.Format("2006-01-02T15:04:05Z07:00"), rb.Reason)
					if rep.ConfigVersion != nil && int64(*rep.ConfigVersion) == rb.ConfigVersion {
						fmt.Fprintf(w, "    config %d stays refused here until it changes: fix it and `shardctl pool set %s --file FILE`, or send the supervisor HUP to retry it as is\n", rb.ConfigVersion, pool)
					}
				}
			}
			for _, e := range rep.MemberErrors {
				fmt.Fprintf(w, "  unreadable member: %s\n", e)
			}
		})
	})
}

func runPoolGet(c *cli.Context) error {
	pool, err := poolArg(c)
	if err != nil {
		return err
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
		p := st.Paths().PoolConfig(pool)
		data, ver, err := topo.ReadPoolConfigData(ctx, st.Session(), st.Paths(), pool)
		if errors.Is(err, zksession.ErrNoNode) {
			return hint.New(fmt.Errorf("pool %s has no config at %s", pool, p), fmt.Sprintf("create it with `shardctl pool set %s --file config.json`", pool))
		}
		if err != nil {
			return err
		}
		cfg, err := topo.DecodePoolConfig(p, data)
		if err != nil {
			return err
		}
		return cliutil.NewPrinter(c).Emit(map[string]any{"pool": pool, "path": p, "znode_version": ver, "config": cfg}, func(w io.Writer) {
			fmt.Fprintf(w, "%s\n", strings.TrimRight(string(data), "\n"))
		})
	})
}

// setArgs accepts the flags after the pool name too (`pool set web --file
// f.json`, as operators type it), which urfave/cli leaves as arguments.
func setArgs(c *cli.Context) (pool, file string, expect int, err error) {
	file, expect = c.String("file"), c.Int("expect-version")
	var rest []string
	args := c.Args().Slice()
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || a == "-" {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return "", "", 0, cliutil.Usagef("pool set: %s needs a value", a)
			}
			i++
			val = args[i]
		}
		switch name {
		case "file", "f":
			file = val
		case "expect-version":
			if _, err := fmt.Sscanf(val, "%d", &expect); err != nil {
				return "", "", 0, cliutil.Usagef("pool set: --expect-version %q is not a number", val)
			}
		default:
			return "", "", 0, cliutil.Usagef("pool set: unknown flag %s", a)
		}
	}
	if len(rest) != 1 {
		return "", "", 0, cliutil.Usagef("pool set: give exactly one pool name")
	}
	if err := topo.ValidName("pool", rest[0]); err != nil {
		return "", "", 0, cliutil.Usagef("%v", err)
	}
	if file == "" {
		return "", "", 0, cliutil.Usagef("pool set: --file is required")
	}
	return rest[0], file, expect, nil
}

func runPoolSet(c *cli.Context) error {
	pool, file, expect, err := setArgs(c)
	if err != nil {
		return err
	}
	var data []byte
	if file == "-" {
		r := c.App.Reader
		if r == nil {
			r = os.Stdin
		}
		data, err = io.ReadAll(r)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return fmt.Errorf("pool set: %w", err)
	}
	// Validate before anything is written: a supervisor would reject an
	// invalid config anyway, but the operator should hear it here.
	cfg, err := topo.DecodePoolConfig(file, data)
	if err != nil {
		return fmt.Errorf("pool set: %w (nothing written)", err)
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, _ *zap.Logger) error {
		p := st.Paths().PoolConfig(pool)
		ver, created, err := topo.SetPoolConfig(ctx, st.Session(), st.Paths(), pool, cfg, int32(expect))
		if err != nil {
			return err
		}
		return cliutil.NewPrinter(c).Emit(map[string]any{"pool": pool, "path": p, "znode_version": ver, "created": created}, func(w io.Writer) {
			verb := "updated"
			if created {
				verb = "created"
			}
			fmt.Fprintf(w, "pool %s config %s at %s (version %d); supervisors of the pool will swap to it\n", pool, verb, p, ver)
		})
	})
}
