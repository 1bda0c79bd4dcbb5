// Package benchkit is what the benchmark programs under bench/ share, so
// that each says once how it finds its environment, paces its load and
// prints its figures:
//
//   - env: flag defaults from the environment (EnvOr, EnvInt,
//     EnvDuration), the scripts/devenv state directory and the flags of
//     a run on its servers (DevFlags; the servers themselves are
//     internal/clustertest's Dev);
//   - load: the pieces of a load loop (Stopper, Pacer, Sleep,
//     IdempotencyKey) and the one name of a benchmark's user (UserID);
//     the write load on app.kv through the router is kvload's;
//   - report: the one percentile summary (Stat, Of, OfDurations:
//     nearest rank, so p50/p99/max mean the same thing in every harness,
//     and Stat.MS, its line), a serialized line printer (Printer),
//     millisecond figures, ratios, the load average and the JSON summary.
//
// It is a library of the benchmarks only: it imports no package of the
// module and nothing but bench/ imports it.
package benchkit
