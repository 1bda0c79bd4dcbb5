package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardvisor/shardvisor/bucketmap"
	"github.com/shardvisor/shardvisor/internal/backoff"
	"github.com/shardvisor/shardvisor/internal/sqlstate"
)

// DefaultRetryFor bounds how long Do keeps retrying a write that the move
// machinery holds back: a pause lasts well under a second.
const DefaultRetryFor = 10 * time.Second

// ErrNoPrimary is what Do's error wraps when it gave up because no
// server of the node accepted a read-write connection: a plain node that
// is down, or a Patroni group between its primary's death and the
// promotion of a standby (at most its ttl, then the new primary answers).
var ErrNoPrimary = errors.New("no server accepted a read-write connection (the node is down, or a failover is under way)")

// Retryable reports whether Do retries an error: what the fence held back
// (SQLSTATE SV001), what never reached the server (pgconn.SafeToRetry),
// and a connection that could not be made (pgconn.ConnectError: no
// server answered, or every one that did is a standby), and a node's
// PgBouncer that found no server for the query (sqlstate.IsPoolerNoServer:
// its server down or starting, as in a failover): the refused
// transaction wrote nothing in any of these cases. An error after a
// statement was sent is never retried: the statement may have committed.
// (Do also retries a write a standby refused on a Patroni group's node:
// standbyRefused.)
func Retryable(err error) bool {
	return sqlstate.IsFenceRejected(err) || pgconn.SafeToRetry(err) || noPrimary(err) || sqlstate.IsPoolerNoServer(err)
}

// standbyRefused reports whether err is a group's standby refusing a
// write (25006) where a failover explains it: through a member's pooler
// the client's connection outlives the member's demotion. The refused
// transaction wrote nothing. On a plain node the same SQLSTATE is the
// application's own READ ONLY transaction or default_transaction_read_only,
// which no retry mends.
func standbyRefused(err error, rt Route) bool {
	return rt.Group != "" && sqlstate.IsReadOnly(err)
}

func noPrimary(err error) bool {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return false
	}
	// A server that answered with a refusal of its own is not a failover:
	// a wrong password (28P01), a missing database (3D000) or too many
	// connections (53300) would only be made worse by a hundred retries.
	// Starting up or shutting down (57P03) and connection errors (08) are.
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "57P03" || strings.HasPrefix(pe.Code, "08")
	}
	return true
}

// Do runs fn on the pool of uid's db node. When the node's fence rejects
// the write (SQLSTATE SV001: the bucket is frozen there in a move's write
// pause, or has moved), or when the error happened before anything reached
// the server (pgconn.SafeToRetry: a connection that could not be made in
// time), it waits a moment, reads the route again and retries, with
// backoff, for up to DefaultRetryFor or until ctx ends. Any other error is
// returned at once.
//
// A bucket whose map state is moving is still written on its owner: the
// move's write pause starts only when the source's fence freezes the
// range, and ends when the map names the target. Holding writes from the
// moment the map says moving would stretch every pause by the time the
// mover waits for routers and supervisors to catch up. Rejected writes to
// a moving bucket poll the in-memory route closely, since it changes the
// moment the map flips.
//
// A connection that cannot be made is retried the same way, so a Patroni
// failover costs a writer a wait, not an error: the pool's next
// connection reaches the promoted standby through the node's multi-host
// DSN. Once the retries run out the error wraps ErrNoPrimary.
//
// fn must be safe to retry: a rejected write was rolled back by the fence.
// Apps in other languages do the same: on SQLSTATE SV001, re-read the route
// (GET /v1/route) and retry. An UPDATE or DELETE on a node that does not
// own the key matches no row, so no fence trigger fires: add the fence's
// check, WHERE bkey = $1 AND ... AND shardvisor.owns($1), so that it fails
// with SV001 (and is retried) instead of answering "0 rows".
func (r *Router) Do(ctx context.Context, uid string, fn func(ctx context.Context, pool *pgxpool.Pool, rt Route) error) error {
	deadline := time.Now().Add(DefaultRetryFor)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// Jittered, so that the writers a pause held back do not all come back
	// in the same millisecond.
	b := backoff.New(2*time.Millisecond, 100*time.Millisecond)
	var last error // the previous attempt's retryable error
	reset := false // the pool was reset after a standby's refusal
	for attempt := 1; ; attempt++ {
		rt, err := r.Route(uid)
		if err != nil {
			return err
		}
		pool, perr := r.NodePool(ctx, rt.Node)
		if perr != nil {
			return perr
		}
		err = fn(ctx, pool, rt)
		standby := standbyRefused(err, rt)
		if standby && !reset {
			// Every connection of the pool may lead to the standby (a
			// pooler's client connections outlive its server's demotion):
			// drop them all, once, so that the next ones are checked again
			// by the DSN's target_session_attrs=read-write. Connections in
			// use close when released.
			pool.Reset()
			reset = true
		}
		if err != nil && last != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			// ctx ended inside this attempt (pgxpool's acquire or connect
			// then returns ctx's error): say what the attempts met.
			return ctxEnded(uid, ctx.Err(), rt, last)
		}
		if err == nil || !Retryable(err) && !standby {
			return err
		}
		last = err
		delay := b.Next()
		if time.Now().Add(delay).After(deadline) {
			if rt.State == bucketmap.BucketMoving {
				err = fmt.Errorf("bucket %d is still moving to %s: %w", rt.Bucket, rt.Target, err)
			}
			if noPrimary(err) {
				err = fmt.Errorf("db node %s: %w: %w", rt.Node, ErrNoPrimary, err)
			}
			return fmt.Errorf("router: gave up on %q after %d attempts: %w", uid, attempt, err)
		}
		// Back off before writing again. While the map says moving, the
		// route changes the moment the map flips and Route is in memory:
		// watch it closely and write again as soon as it changes, without
		// sending the node a write per poll.
		wait := time.NewTimer(delay)
		var poll <-chan time.Time
		var ticker *time.Ticker
		if rt.State == bucketmap.BucketMoving {
			ticker = time.NewTicker(2 * time.Millisecond)
			poll = ticker.C
		}
	waiting:
		for {
			select {
			case <-ctx.Done():
				wait.Stop()
				if ticker != nil {
					ticker.Stop()
				}
				return ctxEnded(uid, ctx.Err(), rt, err)
			case <-wait.C:
				break waiting
			case <-poll:
				if now, rerr := r.Route(uid); rerr == nil && (now.Node != rt.Node || now.State != rt.State) {
					wait.Stop()
					break waiting
				}
			}
		}
		if ticker != nil {
			ticker.Stop()
		}
	}
}

// ctxEnded is Do's error when ctx ends while it retries: ctx's error, and
// what the last attempt on rt's node met.
func ctxEnded(uid string, ctxErr error, rt Route, last error) error {
	if noPrimary(last) {
		return fmt.Errorf("router: %q: %w (last attempt: db node %s: %w: %w)", uid, ctxErr, rt.Node, ErrNoPrimary, last)
	}
	return fmt.Errorf("router: %q: %w (last attempt: %v)", uid, ctxErr, last)
}
