"""DCS, the distributed checkpoint service: who receives weights and what the latest weights are.

`coordinator.Coordinator` is deployed as its own Serve app; roles register their receivers
(engine URLs, training-backend ranks behind `relax.distributed.weights.endpoints.RayEndpoint`); the Actor reads the
topology before every push, rebuilds its broadcast group when the topology version changed,
and publishes the pushed weights' metadata (version, names, dtypes, shapes, bytes).
"""
