// Command notes is the example app: a small multi-user notes service in
// the spirit of a sync service. Every user's notes live on the db node that
// owns the user's bucket; the app finds it through the router library and
// retries writes that a bucket move holds back. It runs as a supervisor
// worker (LISTEN_FDS, READY=1, drains on SIGTERM) or on its own.
//
//	POST   /v1/users/{uid}/notes        {"body": "..."}  -> 201 {"id": N, ...}
//	GET    /v1/users/{uid}/notes                         -> 200 [{"id": N, "body": "...", ...}]
//	PUT    /v1/users/{uid}/notes/{id}   {"body": "..."}  -> 200
//	DELETE /v1/users/{uid}/notes/{id}                    -> 204
//
// A write that failed is answered 503 when it was not applied (the db node
// has no primary for now, or a move held it back past router.Do's retries)
// and 502 with "outcome": "unknown" when it may have committed (the
// connection to the db node died after the statement was sent).
//
// Every write is idempotent, so a client may resend one whose answer it
// did not get (a worker closing a keep-alive connection as it drains, a
// 502 with an unknown outcome): a
// POST with an Idempotency-Key header makes the note whose id the key
// decides, once (a resend answers with that note); a PUT of the body a
// note already has changes nothing; a DELETE that already happened is 404.
//
// Routing: with SHARDVISOR_ZK (and SHARDVISOR_CLUSTER, SHARDVISOR_ZK_ROOT)
// the app follows the live map, so a write caught by a move is retried at
// the new owner within milliseconds. Without them it routes from the map
// file the supervisor hands its workers (SHARDVISOR_MAP_FILE).
//
// NOTES_BOOT_DELAY (a Go duration) delays listening and READY=1, to stand
// in for an app with a slow boot.
//
// `notes schema` creates the table on every db node of the map, by hand
// and unrecorded; `shardctl schema apply examples/notes/schema/001-notes.sql`
// is the way that records it, so that `shardctl node prepare` gives it to
// a node added later.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/dbnode"
	"github.com/shardvisor/shardvisor/keystream"
	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/worker"
	"github.com/shardvisor/shardvisor/workerproto"
)

// Schema is the notes table (schema/001-notes.sql, the change the demo
// applies with `shardctl schema apply`): the bucket key leads the primary
// key, as the sharded-table contract requires (docs/data-contract.md).
//
//go:embed schema/001-notes.sql
var Schema string

type app struct {
	r   *router.Router
	ks  *keystream.Keystream
	log *zap.Logger
}

func main() {
	cfg := zap.NewProductionConfig()
	if len(os.Args) > 1 && os.Args[1] == "schema" {
		cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel) // a one-shot command: say only what matters
	}
	log, _ := cfg.Build()
	defer log.Sync()
	log = log.With(zap.Int("pid", os.Getpid()), zap.String("generation", os.Getenv("SHARDVISOR_GENERATION")))
	r, ks, closeFn, err := openRouter(log)
	if err != nil {
		log.Fatal("routing", zap.Error(err))
	}
	defer closeFn()
	if len(os.Args) > 1 && os.Args[1] == "schema" {
		if err := createSchema(r); err != nil {
			log.Fatal("schema", zap.Error(err))
		}
		fmt.Println("app.notes created on every db node")
		return
	}
	a := &app{r: r, ks: ks, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/users/{uid}/notes", a.create)
	mux.HandleFunc("GET /v1/users/{uid}/notes", a.list)
	mux.HandleFunc("PUT /v1/users/{uid}/notes/{id}", a.update)
	mux.HandleFunc("DELETE /v1/users/{uid}/notes/{id}", a.delete)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	if d := os.Getenv("NOTES_BOOT_DELAY"); d != "" {
		// Stands in for an app that takes a while to load before it can
		// serve (the fleet benchmark's 5 s app): nothing is accepted and
		// READY=1 is not sent until it has passed.
		delay, err := time.ParseDuration(d)
		if err != nil {
			log.Fatal("NOTES_BOOT_DELAY", zap.Error(err))
		}
		time.Sleep(delay)
	}
	ln, err := worker.Listener(envOr("NOTES_ADDR", "127.0.0.1:8080"))
	if err != nil {
		log.Fatal("listen", zap.Error(err))
	}
	log.Info("notes serving", zap.String("addr", ln.Addr().String()), zap.Uint64("map_version", r.Map().Version))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := worker.Serve(srv, ln, 25*time.Second); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal("serve", zap.Error(err))
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// openRouter follows the supervisor's map file in reload mode, else the
// live map in ZooKeeper when configured, else the supervisor's map file.
func openRouter(log *zap.Logger) (*router.Router, *keystream.Keystream, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r *router.Router
	var err error
	// In the supervisor's reload mode the map file comes first, even when
	// the environment also names ZooKeeper (a supervisor passes its own
	// environment on): the supervisor counts on this worker's MAPVERSION
	// acknowledgements. In swap mode the live map is better when there is
	// one: a swap-mode map file never changes under a running worker, so a
	// write it retries across a move's flip could not see the flip.
	if f, ok := workerproto.MapFollowFromEnv(); ok && f.Reload {
		r, err = router.FromWorkerEnv(router.Options{Logger: log, TunePool: tunePool})
	} else if zkc := os.Getenv("SHARDVISOR_ZK"); zkc != "" {
		r, err = router.Dial(ctx, router.Config{Connect: zkc, Root: os.Getenv("SHARDVISOR_ZK_ROOT"),
			Cluster: envOr("SHARDVISOR_CLUSTER", "default"), Logger: log, TunePool: tunePool})
	} else if os.Getenv(workerproto.EnvMapFile) != "" {
		r, err = router.FromWorkerEnv(router.Options{Logger: log, TunePool: tunePool})
	} else {
		return nil, nil, nil, errors.New("set SHARDVISOR_ZK (live map) or run under the supervisor (SHARDVISOR_MAP_FILE)")
	}
	if err != nil {
		return nil, nil, nil, err
	}
	return r, r.Keystream(), r.Close, nil
}

// tunePool keeps each worker's pools small (a generation swap opens them all
// anew) and gives a connection time to authenticate on a busy node.
func tunePool(c *pgxpool.Config) {
	c.MaxConns = 4
	c.ConnConfig.ConnectTimeout = 15 * time.Second
}

func createSchema(r *router.Router) error {
	ctx := context.Background()
	for _, n := range r.Map().Nodes() {
		c, err := dbnode.Connect(ctx, n)
		if err != nil {
			return err
		}
		_, err = c.Exec(ctx, Schema)
		c.Close(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", n.ID, err)
		}
	}
	return nil
}

type note struct {
	ID        int64     `json:"id"`
	Body      string    `json:"body"`
	Version   int64     `json:"version"`
	UpdatedAt time.Time `json:"updated_at"`
	Node      string    `json:"node,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (a *app) fail(w http.ResponseWriter, r *http.Request, code int, err error) {
	out := map[string]string{"error": err.Error()}
	if code == http.StatusServiceUnavailable && r.Method != http.MethodGet && outcomeUnknown(err) {
		// The statement was sent and the connection died before the
		// answer (the db node's primary died, say): the write may have
		// committed. Say so, so that the client resends it with the
		// same Idempotency-Key rather than record it as not done.
		code = http.StatusBadGateway
		out["outcome"] = "unknown"
	}
	if code >= 500 {
		a.log.Warn("request failed", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Int("status", code), zap.Error(err))
	}
	writeJSON(w, code, out)
}

// outcomeUnknown: the error came after the statement was sent and is not
// the server's answer to it: the write may or may not have committed.
// What router.Do gave up on was never sent (or was refused by the fence),
// and a PostgreSQL error is an answer, neither committed, except one that
// ends the session (FATAL, SQLSTATE classes 08 and 57: "terminating
// connection due to unexpected postmaster exit" as the primary dies),
// which is the server going away, not a verdict on the statement.
func outcomeUnknown(err error) bool {
	if router.Retryable(err) || errors.Is(err, errNotFound) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		sev := pe.SeverityUnlocalized
		if sev == "" {
			sev = pe.Severity
		}
		return sev == "FATAL" || sev == "PANIC" || strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57")
	}
	return true
}

func (a *app) key(uid string) int64 { return keystream.Key(a.ks.Prefix64(uid)) }

func readBody(r *http.Request) (string, error) {
	var in struct {
		Body string `json:"body"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return "", fmt.Errorf(`bad JSON: %v; want {"body": "..."}`, err)
	}
	return in.Body, nil
}

func newID() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]) >> 1)
}

func (a *app) create(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	body, err := readBody(r)
	if err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	n := note{ID: newID(), Body: body, Version: 1}
	key := r.Header.Get("Idempotency-Key")
	if key != "" {
		n.ID = keyID(uid, key)
	}
	var reused bool
	err = a.r.Do(r.Context(), uid, func(ctx context.Context, pool *pgxpool.Pool, rt router.Route) error {
		n.Node = string(rt.Node)
		err := pool.QueryRow(ctx, `INSERT INTO app.notes (bkey, uid, id, body) VALUES ($1, $2, $3, $4)
			ON CONFLICT (bkey, uid, id) DO NOTHING RETURNING updated_at`, a.key(uid), uid, n.ID, body).Scan(&n.UpdatedAt)
		if !errors.Is(err, pgx.ErrNoRows) || key == "" {
			return err
		}
		// The key was seen: answer with the note it made.
		var was string
		err = pool.QueryRow(ctx, `SELECT body, version, updated_at FROM app.notes WHERE bkey = $1 AND uid = $2 AND id = $3`,
			a.key(uid), uid, n.ID).Scan(&was, &n.Version, &n.UpdatedAt)
		reused = err == nil && was != body
		return err
	})
	switch {
	case err != nil:
		a.fail(w, r, http.StatusServiceUnavailable, err)
	case reused:
		a.fail(w, r, http.StatusUnprocessableEntity, errors.New("Idempotency-Key already used for another note body"))
	default:
		writeJSON(w, http.StatusCreated, n)
	}
}

// keyID is the id of the note a create with this Idempotency-Key makes,
// so that a resent create finds the note instead of making a second one.
func keyID(uid, key string) int64 {
	h := sha256.Sum256([]byte(uid + "\x00" + key))
	return int64(binary.BigEndian.Uint64(h[:8]) >> 1)
}

func (a *app) list(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	var out []note
	err := a.r.Do(r.Context(), uid, func(ctx context.Context, pool *pgxpool.Pool, rt router.Route) error {
		out = out[:0]
		rows, err := pool.Query(ctx, `SELECT id, body, version, updated_at FROM app.notes WHERE bkey = $1 AND uid = $2 ORDER BY id`, a.key(uid), uid)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			n := note{Node: string(rt.Node)}
			if err := rows.Scan(&n.ID, &n.Body, &n.Version, &n.UpdatedAt); err != nil {
				return err
			}
			out = append(out, n)
		}
		return rows.Err()
	})
	if err != nil {
		a.fail(w, r, http.StatusServiceUnavailable, err)
		return
	}
	if out == nil {
		out = []note{}
	}
	writeJSON(w, http.StatusOK, out)
}

var errNotFound = errors.New("no such note")

func (a *app) noteID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		a.fail(w, r, http.StatusBadRequest, fmt.Errorf("note id %q is not a number", r.PathValue("id")))
		return 0, false
	}
	return id, true
}

func (a *app) update(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	id, ok := a.noteID(w, r)
	if !ok {
		return
	}
	body, err := readBody(r)
	if err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	n := note{ID: id, Body: body}
	err = a.r.Do(r.Context(), uid, func(ctx context.Context, pool *pgxpool.Pool, rt router.Route) error {
		n.Node = string(rt.Node)
		// Idempotent, as PUT should be: the same body again changes
		// nothing, so a resent PUT is harmless. shardvisor.owns fails the
		// statement (SV001, so Do retries) on a node that does not own the
		// key, where no row matches and no fence trigger would fire: a
		// stale route must not turn into a 404.
		err := pool.QueryRow(ctx, `UPDATE app.notes SET body = $4,
				version = CASE WHEN body = $4 THEN version ELSE version + 1 END,
				updated_at = CASE WHEN body = $4 THEN updated_at ELSE now() END
			WHERE bkey = $1 AND uid = $2 AND id = $3 AND shardvisor.owns($1) RETURNING version, updated_at`, a.key(uid), uid, id, body).Scan(&n.Version, &n.UpdatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNotFound
		}
		return err
	})
	a.reply(w, r, err, func() { writeJSON(w, http.StatusOK, n) })
}

func (a *app) delete(w http.ResponseWriter, r *http.Request) {
	uid := r.PathValue("uid")
	id, ok := a.noteID(w, r)
	if !ok {
		return
	}
	err := a.r.Do(r.Context(), uid, func(ctx context.Context, pool *pgxpool.Pool, _ router.Route) error {
		// shardvisor.owns: as in update; a stale route's DELETE must not
		// look done (or "already gone") while the note lives on its owner.
		tag, err := pool.Exec(ctx, `DELETE FROM app.notes WHERE bkey = $1 AND uid = $2 AND id = $3 AND shardvisor.owns($1)`, a.key(uid), uid, id)
		if err == nil && tag.RowsAffected() == 0 {
			return errNotFound
		}
		return err
	})
	a.reply(w, r, err, func() { w.WriteHeader(http.StatusNoContent) })
}

// reply answers a write on one note: 404 when it does not exist, 503 when
// the write failed (Do gave up), else ok.
func (a *app) reply(w http.ResponseWriter, r *http.Request, err error, ok func()) {
	switch {
	case errors.Is(err, errNotFound):
		a.fail(w, r, http.StatusNotFound, err)
	case err != nil:
		a.fail(w, r, http.StatusServiceUnavailable, err)
	default:
		ok()
	}
}
