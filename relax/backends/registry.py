"""Named backends -> where they live. Resolved once (by dotted path, imported lazily) so a
component never compares backend strings and one backend never imports another."""

TRAIN_BACKENDS: dict[str, str] = {
    "fsdp": "relax.backends.fsdp.worker.FSDPTrainWorker",
    "megatron": "relax.backends.megatron.worker.MegatronTrainWorker",
}

INFERENCE_BACKENDS: dict[str, str] = {
    "hf": "relax.backends.hf.launcher.launch_hf_engine",
    "sglang": "relax.backends.sglang.launcher.launch_sglang_engine",
}
