// Command embed is an application in its own Go module that routes its
// users with the shardvisor library: the code docs/router-api.md shows. It
// serves a tiny notes API; each user's notes live on the db node that owns
// the user's bucket.
//
// Run it against a live cluster (SHARDVISOR_ZK, SHARDVISOR_ZK_ROOT,
// SHARDVISOR_CLUSTER, SHARDVISOR_ZK_AUTH_FILE) or as a worker under the
// supervisor, which hands it a listening socket and a map file.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/shardvisor/shardvisor/router"
	"github.com/shardvisor/shardvisor/worker"
)

// Schema is the table each db node needs (the test creates it).
const Schema = `CREATE TABLE IF NOT EXISTS notes (uid text NOT NULL, body text NOT NULL)`

// openRouter follows the cluster's live map when SHARDVISOR_ZK is set, else
// the map file the supervisor hands its workers.
func openRouter(ctx context.Context, log *zap.Logger) (*router.Router, error) {
	if zk := os.Getenv("SHARDVISOR_ZK"); zk != "" {
		// Dial returns once the first map is loaded, or fails when ctx ends.
		return router.Dial(ctx, router.Config{
			Connect:  zk,                                   // "zk1:2181,zk2:2181,zk3:2181"
			Root:     os.Getenv("SHARDVISOR_ZK_ROOT"),      // "" means /shardvisor
			Cluster:  os.Getenv("SHARDVISOR_CLUSTER"),      // "prod"
			AuthFile: os.Getenv("SHARDVISOR_ZK_AUTH_FILE"), // "user:password"; "" for none
			Logger:   log,
		})
	}
	// Under the supervisor: the map file named by SHARDVISOR_MAP_FILE.
	return router.FromWorkerEnv(router.Options{Logger: log})
}

// saveNote writes one of uid's rows on uid's node. Do retries while a move
// of uid's bucket holds writes back (fn must be safe to run again).
func saveNote(ctx context.Context, r *router.Router, uid, body string) error {
	return r.Do(ctx, uid, func(ctx context.Context, pool *pgxpool.Pool, rt router.Route) error {
		_, err := pool.Exec(ctx, `INSERT INTO notes (uid, body) VALUES ($1, $2)`, uid, body)
		return err
	})
}

// readNotes reads uid's rows from uid's node.
func readNotes(ctx context.Context, r *router.Router, uid string) ([]string, error) {
	pool, _, err := r.Pool(ctx, uid) // the pgx pool of uid's node
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT body FROM notes WHERE uid = $1 ORDER BY body`, uid)
	if err != nil {
		return nil, err
	}
	var out []string
	for rows.Next() {
		var b string
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// handler serves GET /route?uid=, GET /notes?uid= and POST /notes?uid=&body=.
func handler(r *router.Router) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			v = map[string]string{"error": err.Error()}
		}
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /route", func(w http.ResponseWriter, req *http.Request) {
		rt, err := r.Route(req.URL.Query().Get("uid")) // in memory: no network, no lock
		reply(w, rt, err)
	})
	mux.HandleFunc("GET /notes", func(w http.ResponseWriter, req *http.Request) {
		notes, err := readNotes(req.Context(), r, req.URL.Query().Get("uid"))
		reply(w, notes, err)
	})
	mux.HandleFunc("POST /notes", func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		reply(w, "ok", saveNote(req.Context(), r, q.Get("uid"), q.Get("body")))
	})
	return mux
}

func main() {
	log, _ := zap.NewProduction()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	r, err := openRouter(ctx, log)
	cancel()
	if err != nil {
		log.Fatal("router", zap.Error(err))
	}
	defer r.Close()
	// The supervisor's socket (LISTEN_FDS), or our own when run by hand.
	ln, err := worker.Listener("127.0.0.1:8080")
	if err != nil {
		log.Fatal("listen", zap.Error(err))
	}
	srv := &http.Server{Handler: handler(r), ReadHeaderTimeout: 10 * time.Second}
	// READY=1 once serving; on SIGTERM, drain without dropping a request.
	if err := worker.Serve(srv, ln, 25*time.Second); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal("serve", zap.Error(err))
	}
}
