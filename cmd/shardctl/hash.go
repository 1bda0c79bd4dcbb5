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
	var m *bucketmap.Map // the live map, when hash reads it
	if c.IsSet("seed") {
		if !c.IsSet("level") {
			return cliutil.Usagef("hash: --level is required with --seed")
		}
		var err error
		if seed, err = keystream.ParseSeed(c.String("seed")); err != nil {
			return cliutil.Usagef("hash: --seed: %v", err)
		}
	} else {
		var err error
		if seed, m, err = clusterSeed(c); err != nil {
			return err
		}
		if !c.IsSet("level") {
			level = m.Level
		} else {
			m = nil // the level asked for, not the map's buckets
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
		name := fmt.Sprint(l.Bucket)
		if m != nil && !m.Uniform() {
			// At mixed depths the user's bucket is at its own depth.
			b := m.BucketOfPrefix(p)
			l.Level, l.Bucket, name = b.Depth, b.Prefix, b.String()
		}
		if err := out.Emit(l, func(w io.Writer) { fmt.Fprintf(w, "%s\t%s\t%s\n", l.UID, name, l.Prefix64) }); err != nil {
			return err
		}
	}
	return nil
}

// clusterSeed reads the cluster's seed and its map.
func clusterSeed(c *cli.Context) (keystream.Seed, *bucketmap.Map, error) {
	log, err := cliutil.Logger(c)
	if err != nil {
		return nil, nil, err
	}
	// Mistakes in --zk-root or --cluster are reported plainly, as by every
	// command; the session's errors say why hash needed one.
	if _, err := cliutil.Paths(c); err != nil {
		return nil, nil, err
	}
	s, paths, err := cliutil.Connect(c, log)
	if err != nil {
		return nil, nil, fmt.Errorf("hash: no --seed given, so the cluster's seed is needed: %w", err)
	}
	defer s.Close()
	rec, err := topo.ReadCluster(c.Context, s, paths)
	if err != nil {
		return nil, nil, err
	}
	seed, err := keystream.ParseSeed(rec.Seed)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster record at %s: %w", paths.Cluster(), err)
	}
	m, _, err := bucketmap.NewStore(s, paths).Load(c.Context)
	if err != nil {
		return nil, nil, err
	}
	return seed, m, nil
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
