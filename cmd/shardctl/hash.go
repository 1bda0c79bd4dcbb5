package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/cliutil"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/topo"
)

type hashLine struct {
	UID      string `json:"uid"`
	Level    int    `json:"level"`
	Bucket   uint32 `json:"bucket"`
	Prefix64 string `json:"prefix64"`
	Key      int64  `json:"key"`
}

func runHash(c *cli.Context) error {
	level := c.Int("level")
	if c.IsSet("level") {
		if err := keystream.CheckLevel(level); err != nil {
			return cliutil.Usagef("hash: --level: %v", err)
		}
	}
	var seed keystream.Seed
	if c.IsSet("seed") {
		if !c.IsSet("level") {
			return cliutil.Usagef("hash: --level is required with --seed")
		}
		var err error
		if seed, err = keystream.ParseSeed(c.String("seed")); err != nil {
			return cliutil.Usagef("hash: --seed: %v", err)
		}
	} else {
		var mapLevel int
		var err error
		if seed, mapLevel, err = clusterSeed(c); err != nil {
			return err
		}
		if !c.IsSet("level") {
			level = mapLevel
		}
	}
	ks, err := keystream.New(seed)
	if err != nil {
		return err
	}
	uids, err := userIDs(c)
	if err != nil {
		return err
	}
	out := cliutil.NewPrinter(c)
	for _, uid := range uids {
		p := ks.Prefix64(uid)
		l := hashLine{UID: uid, Level: level, Bucket: keystream.BucketOf(p, level), Prefix64: fmt.Sprintf("%016x", p), Key: keystream.Key(p)}
		if err := out.Emit(l, func(w io.Writer) { fmt.Fprintf(w, "%s\t%d\t%s\n", l.UID, l.Bucket, l.Prefix64) }); err != nil {
			return err
		}
	}
	return nil
}

// clusterSeed reads the cluster's seed and its map's level.
func clusterSeed(c *cli.Context) (keystream.Seed, int, error) {
	log, err := cliutil.Logger(c)
	if err != nil {
		return nil, 0, err
	}
	// Mistakes in --zk-root or --cluster are reported plainly, as by every
	// command; the session's errors say why hash needed one.
	if _, err := cliutil.Paths(c); err != nil {
		return nil, 0, err
	}
	s, paths, err := cliutil.Connect(c, log)
	if err != nil {
		return nil, 0, fmt.Errorf("hash: no --seed given, so the cluster's seed is needed: %w", err)
	}
	defer s.Close()
	rec, err := topo.ReadCluster(c.Context, s, paths)
	if err != nil {
		return nil, 0, err
	}
	seed, err := keystream.ParseSeed(rec.Seed)
	if err != nil {
		return nil, 0, fmt.Errorf("cluster record at %s: %w", paths.Cluster(), err)
	}
	m, _, err := bucketmap.NewStore(s, paths).Load(c.Context)
	if err != nil {
		return nil, 0, err
	}
	return seed, m.Level, nil
}

// userIDs are the user ids hash and route answer for: the arguments, or
// else the lines of stdin.
func userIDs(c *cli.Context) ([]string, error) {
	if c.NArg() > 0 {
		return c.Args().Slice(), nil
	}
	uids, err := readLines(c.App.Reader)
	if err == nil && len(uids) == 0 {
		err = cliutil.Usagef("%s: no user ids given (pass them as arguments or one per line on stdin)", c.Command.Name)
	}
	return uids, err
}

func readLines(r io.Reader) ([]string, error) {
	if r == nil {
		r = os.Stdin
	}
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if line := strings.TrimRight(sc.Text(), "\r"); line != "" {
			out = append(out, line)
		}
	}
	return out, sc.Err()
}
