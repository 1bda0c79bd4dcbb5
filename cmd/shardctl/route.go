package main

import (
	"context"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/sidecar"
)

func runRoute(c *cli.Context) error {
	uids, err := userIDs(c)
	if err != nil {
		return err
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		r := router.New(st.Session(), st.Paths(), router.Options{Logger: log})
		defer r.Close()
		wctx, cancel := context.WithTimeout(ctx, c.Duration(cliutil.FlagZKTimeout))
		defer cancel()
		if err := r.WaitReady(wctx); err != nil {
			return fmt.Errorf("route: %w", err)
		}
		out := cliutil.NewPrinter(c)
		for _, uid := range uids {
			rt, err := r.RouteAt(uid, c.Uint64("map-version"))
			if err != nil {
				return err
			}
			v := sidecar.JSONRoute(uid, rt)
			if err := out.Emit(v, func(w io.Writer) {
				b := bucketmap.Bucket{Prefix: rt.Bucket, Depth: rt.Level}
				line := fmt.Sprintf("%s\tbucket %s\t%s\t%s\tmap v%d", uid, r.Map().Name(b), rt.Node, rt.State, rt.MapVersion)
				if rt.Target != "" {
					line += " -> " + string(rt.Target)
				}
				if rt.Moved {
					line += fmt.Sprintf("\tMOVED from %s", rt.MovedFrom)
				}
				fmt.Fprintln(w, line)
			}); err != nil {
				return err
			}
		}
		return nil
	})
}
