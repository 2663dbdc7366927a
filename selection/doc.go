// Package selection is the routing engine of caddy-kvrouter: the worker
// catalog, load accounting, the cost function, reservations, pending
// selections and session affinity. Its HTTP API, wire-compatible with
// NVIDIA Dynamo's standalone selection service, is package
// selection/api (docs/selection-api.md); the block hashing is described
// in docs/hashing.md.
//
// # Bounds
//
// Dynamo's service trusts its callers; this one may be reachable by anyone
// who reaches the gateway, so everything a request controls is bounded,
// checked before anything is allocated for it:
//
//   - Registrations: Config.MaxRanksPerWorker (256 ranks, 422 past it),
//     Config.MaxRanks (4096 over the catalog, 409), Config.MaxWorkers
//     (65,536, 409), field sizes MaxFieldBytes, MaxEndpointBytes,
//     MaxTaints and MaxMapEntries (422), and kv_events_endpoints keyed by
//     the worker's own ranks (422). WithEndpointCheck lets the host refuse
//     endpoints (422), such as the gateway's own listeners.
//   - Bookings: Config.MaxReservationsPerRank (4096; a full rank is not a
//     candidate, 503 when none is left), Config.MaxReservationsPerClient
//     (1024 per remote IP through the API, 429) and
//     Config.MaxReservationBlocksPerClient (4,194,304 prompt blocks over
//     those bookings, 429); selection ids of at most 256 bytes (400).
//   - GET /dump: Config.MaxDumpEvents (100,000 events), streamed; a
//     partition the cap cut is marked "truncated": true.
//   - Request bodies: api.NewHandler's maxBody (8 MiB, 413).
//
// # Catalog writes
//
// Through the API, catalog writes are privileged (see package
// selection/api). A write that changes a worker's endpoint replaces the
// server: its cached prefixes, bookings, session bindings, pending
// selections and failure history are dropped.
//
// # Worker health
//
// Callers report each upstream answer to Router.Health (ReportStatus, or
// ReportFailure and ReportSuccess): dial errors and 502/503/504 are failures, 429 is
// neither, anything else a success. A worker failing for
// Config.WorkerDownAfter (30s) with no success leaves the candidates and
// comes back when GET /health answers 2xx.
package selection
