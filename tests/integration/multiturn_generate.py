"""A two-turn custom generate function in the seed's style: model turn, an environment
observation (loss_mask 0, log-prob 0), model turn. Used to check the plugin path end to end."""

from relax.engine.rollout.sglang_rollout import GenerateState, parse_weight_version
from relax.types import Sample
from relax.utils.http_utils import post

OBSERVATION = " ok "


async def generate(args, sample: Sample, sampling_params: dict, evaluation: bool = False) -> Sample:
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_ids = state.tokenizer.encode(sample.prompt, add_special_tokens=False)
    sample.tokens, sample.loss_mask, sample.rollout_log_probs, response = list(prompt_ids), [], [], []
    for turn in range(2):
        out = await post(url, {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True})
        new = [t[1] for t in out["meta_info"]["output_token_logprobs"]]
        sample.tokens += new
        response += new
        sample.loss_mask += [1] * len(new)
        sample.rollout_log_probs += [t[0] for t in out["meta_info"]["output_token_logprobs"]]
        sample.weight_versions.append(parse_weight_version(out["meta_info"]["weight_version"]))
        if turn == 0:
            obs = state.tokenizer.encode(OBSERVATION, add_special_tokens=False)
            sample.tokens += obs
            response += obs
            sample.loss_mask += [0] * len(obs)
            sample.rollout_log_probs += [0.0] * len(obs)
    sample.response = state.tokenizer.decode(response)
    sample.response_length = len(response)
    sample.status = Sample.Status.COMPLETED
    return sample
