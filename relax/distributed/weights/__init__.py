"""Weight sync: the trainer pushes HF-named tensors to inference engines and scoring ranks.

SGLang's weight-update protocol over a torch.distributed broadcast group, or CUDA IPC handles to
a receiver on the sender's own GPU (ARCHITECTURE.md §6). One module per responsibility:
- `protocol.py`: the protocol's steps, wire types (TensorSpec, dtypes), buckets, limits;
- `errors.py`: its errors (torch-free: a process holding only endpoints imports them);
- `group.py`: the broadcast group outside torch.distributed's default one, and the daemon
  thread its blocking calls run in;
- `sender.py`: `WeightSender`, rank 0 of a push;
- `endpoints.py`: the receivers the sender talks to (HTTP engines, Ray-held training ranks);
- `receiver.py`: `WeightReceiver`, loading what arrives into a model (the hf engine's, and the
  training backends' subclasses);
- `ipc.py`: the CUDA IPC payload of `/update_weights_from_tensor`, both sides;
- `armed.py`: Relax's armed push (a whole push in two requests), both sides.
"""
