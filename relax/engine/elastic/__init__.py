"""Elastic rollout scaling: grow and shrink the engine fleet while the run trains (docs/elastic-scaling.md).

- `operations`: an operation's record (id, status, events) and the book that keeps them: one runs at a
  time (another gets `Conflict` naming it), a repeated idempotency key returns the first operation.
- `policies`: the pure decisions (which engines a scale-in drains, what a half-failed scale-out keeps:
  `PARTIAL_SUCCESS`).
- `scaler`: `FleetScaler` carries the operations out over a `FleetOps` (launch or register, weights,
  admit; drain, evict, release), cancellable with rollback to the previous fleet.
- `local_ops`: `FleetOps` over an `EngineFleet` in this process (tests, benches); `run_ops`: the run's, in
  the Rollout role: local fleet operations, weights for new engines from the Actor via the DCS coordinator.
- `fleet_lock`: one change of the fleet at a time; scaling operations and the HealthManager's engine
  replacements (from the driver, by name) hold it.
- `api` + `requests`: the authenticated REST API over a scaler, its bodies validated.
- `discovery`: where the API's address and token live in the run directory (`relax-scale` reads them).
- `autoscaler`: a pure decision rule over measured signals and a loop that acts through the scaler.
- `service`: all of it in a run, hosted by the Rollout role (`Rollout.start_scaling`): the API, the
  scaler, the autoscaler, the step metrics (`elastic/*`), the event log and the timeline.
"""
