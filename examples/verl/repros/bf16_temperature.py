"""verl 0.9.1 on bf16 logits: the temperature it applies (tau cast to bf16) and the bf16 log-probs of logprobs_from_logits without flash-attn.

Run: PYTHONPATH=python .venv/bin/python examples/verl/repros/bf16_temperature.py
"""
import warnings, torch
warnings.simplefilter("ignore")
from verl.workers.engine.fsdp.transformer_impl import _scale_logits_by_temperature
from verl.utils import torch_functional as F
torch.manual_seed(0)
z = (torch.randn(4, 32000) * 3).bfloat16()
labels = torch.randint(0, 32000, (4,))
for tau in [0.7, 0.6, 1.0]:
    t = torch.full((4, 1), tau, dtype=torch.float32)
    scaled = _scale_logits_by_temperature(z, t, is_unit_temperature=(tau == 1.0))
    print(f"tau={tau}: tau as verl applies it to bf16 logits = {torch.tensor(tau).bfloat16().item()!r}")
    exact = torch.log_softmax(z.double() / tau, -1).gather(-1, labels[:, None])[:, 0]
    verl = F.logprobs_from_logits(scaled, labels)
    f32 = torch.log_softmax(scaled.float(), -1).gather(-1, labels[:, None])[:, 0]
    print("   exact logp (f64, z/tau)      ", exact.numpy())
    print("   verl logprobs_from_logits    ", verl.float().numpy(), verl.dtype)
    print("   f32 log_softmax of verl's z/tau", f32.numpy())
