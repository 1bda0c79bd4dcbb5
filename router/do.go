package router

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/fence"
)

// DefaultRetryFor bounds how long Do keeps retrying a write that the move
// machinery holds back: a pause lasts well under a second.
const DefaultRetryFor = 10 * time.Second

// Do runs fn on the pool of uid's db node. While the user's bucket is in a
// move's write pause (state moving), when the node's fence rejects the
// write (SQLSTATE SV001: the bucket is frozen there or has moved), or when
// the error happened before anything reached the server (pgconn.SafeToRetry:
// a connection that could not be made in time), it waits a moment, reads
// the route again and retries, with backoff, for up to DefaultRetryFor or
// until ctx ends. Any other error is returned at once.
//
// fn must be safe to retry: a rejected write was rolled back by the fence.
// Apps in other languages do the same: on SQLSTATE SV001, re-read the route
// (GET /v1/route) and retry.
func (r *Router) Do(ctx context.Context, uid string, fn func(ctx context.Context, pool *pgxpool.Pool, rt Route) error) error {
	deadline := time.Now().Add(DefaultRetryFor)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	backoff := 2 * time.Millisecond
	for attempt := 1; ; attempt++ {
		rt, err := r.Route(uid)
		if err != nil {
			return err
		}
		retry := rt.State == bucketmap.BucketMoving
		if !retry {
			pool, perr := r.NodePool(ctx, rt.Node)
			if perr != nil {
				return perr
			}
			err = fn(ctx, pool, rt)
			// Retry what the fence held back, and what never reached the
			// server (a connection that could not be made in time).
			if err == nil || !(fence.IsRejected(err) || pgconn.SafeToRetry(err)) {
				return err
			}
			retry = true
		}
		if time.Now().Add(backoff).After(deadline) {
			if err == nil {
				err = fmt.Errorf("bucket %d is still moving to %s", rt.Bucket, rt.Target)
			}
			return fmt.Errorf("router: gave up on %q after %d attempts: %w", uid, attempt, err)
		}
		// While the map says moving, the answer changes the moment the
		// map flips and Route is in memory: poll it closely. A rejection
		// by the fence backs off.
		wait := backoff
		if rt.State == bucketmap.BucketMoving {
			wait = 2 * time.Millisecond
		} else {
			backoff = min(2*backoff, 100*time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
