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
//     and Stat.MS, its line), a serialized line printer (Printer) and
//     the -json flag that moves it to stderr (Out), millisecond figures,
//     ratios, a goal's verdict (Verdict), the load average and the JSON
//     summary;
//   - flags: -level (LevelFlag), as every benchmark that builds a map
//     names it;
//   - compare: --compare-tls (CompareFlag) and the side-by-side summary
//     of a plain and a TLS run (Comparison: figures read from both JSON
//     summaries, their ratios TLS/plain against issue 38's goal, checks
//     each run must pass); internal/clustertest's CompareMain runs it.
//
// It is a library of the benchmarks only: it imports no package of the
// module, and nothing but bench/ and internal/clustertest (the
// benchmarks' fixture) imports it.
package benchkit
