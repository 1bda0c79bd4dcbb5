-- The notes table: the bucket key leads the primary key, as the
-- sharded-table contract requires (docs/data-contract.md). Applied with
-- `shardctl schema apply examples/notes/schema/001-notes.sql`, which
-- records it, so that `shardctl node prepare` gives it to new nodes.
CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.notes (
	bkey       bigint NOT NULL,
	uid        text NOT NULL,
	id         bigint NOT NULL,
	body       text NOT NULL,
	version    bigint NOT NULL DEFAULT 1,
	updated_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (bkey, uid, id)
);
