"""Plain-torch GSPO-token from SPEC v2's formulas (no library), only the configuration of
harness-gspo-clamp-edge-false-alarm.json: it fails that repro exactly as verl does, so the
failure is the harness's (FINDINGS.md, "Harness"), not verl's.

    grpo-verify replay --impl examples/verl/repros/plain_gspo_token.py:grpo_loss \
        examples/verl/repros/harness-gspo-clamp-edge-false-alarm.json
"""
import torch

def grpo_loss(*, logits, tokens, mask, advantages, old_logp, ref_logp, hparams, config, is_weights=None):
    if (config["ratio_level"], config["policy_loss"], config["aggregation"]) != ("sequence_token", "ppo", "seq_mean_token_mean") \
            or config["kl"] or config["entropy_bonus"] or config["two_sided"] or config["on_policy"] or config["temperature_mode"] != "logits" \
            or config["logit_transform"] or config["rollout_correction"]:
        raise NotImplementedError("only the repro's configuration")
    valid = mask > 0
    safe = torch.where(valid, tokens, torch.zeros_like(tokens))
    z = logits.float() / hparams["temperature"]
    logp = z.gather(-1, safe[..., None])[..., 0] - torch.logsumexp(z, -1)
    old = torch.where(valid, old_logp, logp.detach())
    count = mask.sum(1, keepdim=True).clamp(min=1)
    seq = (mask * (logp - old)).sum(1, keepdim=True) / count
    x = torch.clamp(seq.detach() + (logp - logp.detach()), min=hparams["log_ratio_min"], max=hparams["log_ratio_max"])
    r = torch.exp(x)
    a = advantages[:, None]
    ppo = -torch.minimum(r * a, torch.clamp(r, 1 - hparams["eps_low"], 1 + hparams["eps_high"]) * a)
    loss = ((mask * ppo).sum(1, keepdim=True) / count).sum() / mask.shape[0]
    return loss, {"logp": logp}

grpo_loss.framework = "torch"
grpo_loss.spec_version = 2
grpo_loss.static_hparams = True
