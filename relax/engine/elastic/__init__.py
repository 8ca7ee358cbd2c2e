"""Elastic rollout scaling: grow and shrink the engine fleet while the run trains (docs/elastic-scaling.md).

- `operations`: an operation's record (id, status, events) and the book that keeps them: one runs at a
  time (another gets `Conflict` naming it), a repeated idempotency key returns the first operation.
- `policies`: the pure decisions (which engines a scale-in drains, what a half-failed scale-out keeps:
  `PARTIAL_SUCCESS`).
- `scaler`: `FleetScaler` carries the operations out over a `FleetOps` (launch or register, weights,
  admit; drain, evict, release), cancellable with rollback to the previous fleet.
- `local_ops`: `FleetOps` over an `EngineFleet` in this process (the Rollout's, tests, benches); `calls`:
  each of its operations as a typed call the Rollout role applies (`Rollout.fleet_call`).
- `api` + `requests`: the authenticated REST API over a scaler, its bodies validated.
- `discovery`: where the API's address and token live in the run directory (`relax-scale` reads them).
- `autoscaler`: a pure decision rule over measured signals and a loop that acts through the scaler.
"""
