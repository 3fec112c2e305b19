"""Adds HF transformers' float64 teacher-forced logprobs to every model fixture's reference.json.

HF's own fp32 result sits up to ~2e-4 away from the exact value on peaked fixtures, so a 1e-4 check
between two fp32 engines would measure the noise of both. The float64 run of the same HF model is the
tight reference; the fp32 one stays for a looser check. Runs where make_model_fixtures.py runs.
"""
import json
import pathlib
import sys

import torch
from transformers import JambaConfig, JambaForCausalLM

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import jamba_reference as ref  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


@torch.no_grad()
def fp64_logprobs(model, tokens):
    input_ids = torch.tensor([tokens], dtype=torch.long)
    logits = model(input_ids=input_ids, use_cache=False).logits[0]
    assert logits.dtype == torch.float64
    return torch.log_softmax(logits, dim=-1)


def load_fp64_model(model_dir):
    # transformers 5.17's strict config refuses a literal null num_key_value_heads (which means nh).
    config_dict = json.loads((model_dir / "config.json").read_text())
    if config_dict.get("num_key_value_heads") is None:
        config_dict["num_key_value_heads"] = config_dict["num_attention_heads"]
    config = JambaConfig.from_dict(config_dict)
    config.use_mamba_kernels = False
    model = JambaForCausalLM.from_pretrained(
        str(model_dir), config=config, dtype=torch.float32, attn_implementation="eager").double().eval()
    return model


def add_to_fixture(reference_path):
    document = json.loads(reference_path.read_text())
    model_dir = ROOT / document["model_dir"] if "model_dir" in document else reference_path.parent
    model = load_fp64_model(model_dir)
    # The grouped-GEMM expert path takes no float64; the eager loop computes the same function.
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    else:
        model.config._experts_implementation = "eager"
    worst = 0.0
    for sequence in document["teacher_forced"]:
        tokens = sequence["tokens"]
        lp = fp64_logprobs(model, tokens)
        sequence["logprobs_fp64"] = [None] + [lp[i - 1, tokens[i]].item() for i in range(1, len(tokens))]
        for i in range(1, len(tokens)):
            worst = max(worst, abs(sequence["logprobs_fp64"][i] - sequence["logprobs"][i]))
    document["hf_fp32_vs_fp64_max_abs"] = worst
    reference_path.write_text(json.dumps(document) + "\n")
    print(f"{reference_path.parent.name}: HF fp32 vs fp64 max |dlogprob| = {worst:.3e}", flush=True)


def main():
    torch.manual_seed(0)
    for reference_path in sorted((ROOT / "tests/fixtures/models").glob("*/reference.json")):
        add_to_fixture(reference_path)


if __name__ == "__main__":
    main()
