package main

import (
	"context"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/ownership"
)

// runMapEncoding shows how the map record is stored, or switches it
// (bucketmap.Store.SetEncoding).
func runMapEncoding(c *cli.Context) error {
	if c.NArg() > 1 {
		return cliutil.Usagef("map-encoding: at most one argument, plain or gzip")
	}
	var want bucketmap.MapEncoding
	if c.NArg() == 1 {
		enc, err := bucketmap.ParseMapEncoding(c.Args().First())
		if err != nil {
			return cliutil.Usagef("map-encoding: %v", err)
		}
		want = enc
	}
	return withStore(c, func(ctx context.Context, st *bucketmap.Store, log *zap.Logger) error {
		var m *bucketmap.Map
		var res *ownership.Result
		var err error
		if want == "" {
			m, _, err = st.Load(ctx)
		} else {
			// A new map version like any other: the fences follow it.
			m, res, err = owners(c, st).SetEncoding(ctx, want)
		}
		if err != nil {
			return err
		}
		changed := res != nil
		if changed {
			printDrift(c, res)
			log.Info("map encoding", zap.String("encoding", string(m.Encoding)), zap.Uint64("map_version", m.Version))
		}
		js, err := bucketmap.EncodeJSON(m)
		if err != nil {
			return err
		}
		stored, err := bucketmap.Encode(m)
		if err != nil {
			return err
		}
		return cliutil.NewPrinter(c).Emit(map[string]any{"encoding": m.Encoding, "changed": changed, "map_version": m.Version, "stored_bytes": len(stored), "plain_bytes": len(js)}, func(w io.Writer) {
			verb := "is stored"
			if changed {
				verb = "now stored"
			} else if want != "" {
				verb = "was already stored"
			}
			fmt.Fprintf(w, "map record %s %s: %d bytes (plain JSON %d bytes), map version %d\n", st.MapPath(), verb+" "+string(m.Encoding), len(stored), len(js), m.Version)
		})
	})
}
