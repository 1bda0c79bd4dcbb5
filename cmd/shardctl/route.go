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
)

func routeCommand() *cli.Command {
	return &cli.Command{
		Name:      "route",
		Usage:     "answer which db node holds each user id, from the live map (the sidecar's answer)",
		ArgsUsage: "UID... (or one per line on stdin)",
		Flags: []cli.Flag{
			&cli.Uint64Flag{Name: "map-version", Usage: "the map `version` the caller used: answers say moved when the owner differs since"},
		},
		Action: func(c *cli.Context) error {
			uids := c.Args().Slice()
			if len(uids) == 0 {
				var err error
				if uids, err = readLines(c.App.Reader); err != nil {
					return err
				}
				if len(uids) == 0 {
					return cliutil.Usagef("route: no user ids given (pass them as arguments or one per line on stdin)")
				}
			}
			return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
				r := router.New(st.Session(), st.Paths(), router.Options{Logger: log})
				defer r.Close()
				wctx, cancel := context.WithTimeout(ctx, cliutil.Duration(c, cliutil.FlagZKTimeout))
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
					v := router.JSONRoute(uid, rt)
					if err := out.Emit(v, func(w io.Writer) {
						line := fmt.Sprintf("%s\tbucket %d\t%s\t%s\tmap v%d", uid, rt.Bucket, rt.Node, rt.State, rt.MapVersion)
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
		},
	}
}
