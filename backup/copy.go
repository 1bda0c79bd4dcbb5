package backup

import (
	"context"
	"io"

	"github.com/jackc/pgx/v5"
)

// copyRange pipes the rows src's COPY ... TO STDOUT writes into dst's COPY
// ... FROM STDIN, both in PostgreSQL's binary format: no row is decoded
// here. A failure on either side ends both.
func copyRange(ctx context.Context, src, dst *pgx.Conn, out, in string) error {
	r, w := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		_, err := src.PgConn().CopyTo(ctx, w, out)
		w.CloseWithError(err)
		errc <- err
	}()
	_, err := dst.PgConn().CopyFrom(ctx, r, in)
	r.CloseWithError(err)
	if srcErr := <-errc; srcErr != nil {
		return srcErr
	}
	return err
}
