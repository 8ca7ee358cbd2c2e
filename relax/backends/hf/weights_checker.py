"""`/weights_checker` of the hf engine: SGLang's endpoint, answering `checksum` by HF name.

SGLang's weights checker hashes the tensors it holds under its own names (fused, sharded). The hf
engine holds a transformers model whose tensors a push names directly (`receiver.hf_targets`), so its
`checksum` takes the names to hash (Relax's extension: `names`; default every tensor) and answers
each one's checksum and dtype, and the names it does not hold (`missing`); the trainer compares them
with what it sent (--check-weight-update-equal, `relax.distributed.weights.check`). /server_info
says so (`weights_checker_by_name`). SGLang's other actions (snapshot, reset_tensors, compare) are
refused with a 400 that says why. The hash runs off the event loop, under the weight-update lock
(no bucket loads meanwhile); an engine on a GPU copies each tensor to the host to hash it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, StrictStr

from relax.distributed.weights.checksums import named_checksums
from relax.distributed.weights.receiver import hf_targets


class WeightsCheckerRequest(BaseModel):
    """SGLang's CheckWeightsReqInput (its allow_quant_error, skip_tensor_list, selector are accepted and
    have nothing to act on here), plus `names`."""

    model_config = ConfigDict(extra="ignore")
    action: StrictStr = "checksum"
    names: list[StrictStr] | None = None


def add_weights_checker_route(app: Any, engine: Any, error_response: Callable[[int, str], Any]) -> None:
    @app.api_route("/weights_checker", methods=["GET", "POST"])
    async def weights_checker(req: WeightsCheckerRequest | None = None):
        req = req or WeightsCheckerRequest()
        if req.action != "checksum":
            return error_response(400, f"weights_checker action {req.action!r}: the hf engine answers 'checksum' "
                                       "by HF name (SGLang's snapshot / reset_tensors / compare exist for engines "
                                       "whose tensors are not named as the trainer's)")
        async with engine.weight_update_lock:
            body = await asyncio.to_thread(named_checksums, hf_targets(engine.model), req.names)
        return {"success": True, "message": f"checksums of {len(body['checksums'])} tensors", **body}
