package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/topo"
	"github.com/shardvisor/shardvisor/zksession"
)

type pingReport struct {
	Connect        string           `json:"connect"`
	SessionID      string           `json:"session_id"`
	SessionTimeout string           `json:"session_timeout"`
	ConnectTime    string           `json:"connect_time"`
	Steps          []pingStepReport `json:"steps"`
}

type pingStepReport struct {
	Step     string `json:"step"`
	Path     string `json:"path"`
	Duration string `json:"duration"`
}

func runZKPing(c *cli.Context) error {
	log, err := cliutil.Logger(c)
	if err != nil {
		return err
	}
	start := time.Now() // not withStore: the connection is timed
	s, paths, err := cliutil.Connect(c, log)
	if err != nil {
		return err
	}
	defer s.Close()
	rep := pingReport{Connect: c.String(cliutil.FlagZK), SessionID: fmt.Sprintf("0x%x", s.SessionID()),
		SessionTimeout: s.SessionTimeout().String(), ConnectTime: time.Since(start).Round(time.Microsecond).String()}
	host, _ := os.Hostname()
	steps, err := topo.Probe(c.Context, s, paths, fmt.Sprintf("%s-%d", host, os.Getpid()))
	for _, st := range steps {
		rep.Steps = append(rep.Steps, pingStepReport{Step: st.Step, Path: st.Path, Duration: st.Duration.Round(time.Microsecond).String()})
	}
	if err != nil {
		return fmt.Errorf("zk ping: %w", err)
	}
	return cliutil.NewPrinter(c).Emit(rep, func(w io.Writer) {
		fmt.Fprintf(w, "connected to %s in %s: session %s, timeout %s\n", rep.Connect, rep.ConnectTime, rep.SessionID, rep.SessionTimeout)
		for _, st := range rep.Steps {
			fmt.Fprintf(w, "  %-6s %s  %s\n", st.Step, st.Path, st.Duration)
		}
	})
}

func runZKStatus(c *cli.Context) error {
	cs, err := zksession.ParseConnect(c.String(cliutil.FlagZK))
	if err != nil {
		return cliutil.Usagef("--zk: %v", err)
	}
	ctx, cancel := context.WithTimeout(c.Context, c.Duration(cliutil.FlagZKTimeout))
	defer cancel()
	cfg, err := cliutil.SessionConfig(c, nil)
	if err != nil {
		return err
	}
	e := zksession.Ensemble(ctx, cs, cfg.Dial)
	all, quorum := e.Servers, e.Quorum
	err = cliutil.NewPrinter(c).Emit(map[string]any{"servers": all, "quorum": quorum}, func(w io.Writer) {
		for _, st := range all {
			if st.Err != "" {
				fmt.Fprintf(w, "%-22s DOWN      %s\n", st.Addr, st.Err)
				continue
			}
			fmt.Fprintf(w, "%-22s %-9s zxid %s, %d connections, latency %s ms\n", st.Addr, st.Mode, st.Zxid, st.Connections, st.Latency)
		}
		fmt.Fprintf(w, "quorum: %v (%d of %d serving, %d leader)\n", quorum, e.Serving, len(cs.Servers), e.Leaders)
	})
	if err == nil && !quorum {
		return fmt.Errorf("zookeeper ensemble %s has no serving quorum", cs)
	}
	return err
}
