"""What the library adapters (examples/<library>/adapter.py) share: how they refuse a configuration,
and SPEC's aggregation in the `loss_type` vocabulary of TRL's GRPOConfig, which Liger and Unsloth
take too.

An adapter imports this file by its path, as the worker imports the adapter itself (`--impl
path.py:function` goes through `grpo_verify_worker.loader.import_file`, which puts no folder on
sys.path, so `import spec_mapping` would find nothing):

    from grpo_verify_worker.loader import import_file

    spec_mapping = import_file(pathlib.Path(__file__).parents[1] / "spec_mapping.py")

import_file keeps one module per path, so every adapter of a worker gets the same module, and the
same `Refusal` class.
"""

import dataclasses

from grpo_kernels import schema


class Refusal(NotImplementedError):
    """A configuration the library cannot compute: the suite records it as unsupported, not failed
    (docs/spec.md, "Implementation adapter"). `switch` (a config switch of schema.json) and `value`
    name what is refused as data when given; with `switch` None the suite reads the message's words
    instead (docs/spec.md, "Refusing a configuration")."""

    def __init__(self, message, switch=None, value=None):
        super().__init__(message)
        self.switch = switch
        self.value = value


def refuse(library, what, switch=None, value=None):
    """Raise a Refusal "<library>: <what>", with `switch` and `value` as data (docs/spec.md,
    "Refusing a configuration"): the switch whose value the library cannot compute, the one the
    suite's plan should move back. The adapters pass it at every refusal; `switch=None` says the
    refusal is of a hyperparameter or a shape, which no switch relaxes (the suite then reads the
    message, and counts it among the refusals read so)."""
    if switch is not None and switch not in schema.SWITCHES:
        raise ValueError(f"refuse({library!r}, ...): switch {switch!r} is not a switch of schema.json "
                         f"({', '.join(schema.SWITCHES)})")
    raise Refusal(f"{library}: {what}", switch, value)


@dataclasses.dataclass(frozen=True)
class LossType:
    """A `loss_type` of TRL's GRPOConfig and what its denominator reads:

        grpo, sapo    (1/B) sum_b [ sum_t(m * loss_t) / max(sum_t m, 1) ]
        bnpo          sum(m * loss_t) / max(sum(m), 1)
        dr_grpo       sum(m * loss_t) / (B * max_completion_length)
        dapo, cispo   sum(m * loss_t) / num_items_in_batch

    A field the loss type does not read is None; so is dapo's and cispo's num_items_in_batch where the
    library counts the mask itself (`own_count` below).
    """

    name: str
    max_completion_length: float | None = None
    num_items_in_batch: object = None  # a float, or the mask's sum as the library's tensor


def trl_loss_type(library, config, hparams, mask, own_count=False):
    """The LossType that gives SPEC's aggregation of the policy loss (docs/spec.md, "Aggregation" and
    v2's "Entropy and aggregation"), or a refusal of what none gives:

        ppo   seq_mean_token_mean                             grpo
        sapo  seq_mean_token_mean                             sapo (aggregated like grpo)
        ppo   token_mean                                      bnpo
        cispo token_mean                                      cispo, num_items_in_batch = the valid count
        ppo   sum_over_constant, N = B * T                    dr_grpo, max_completion_length = T
        ppo   sum_over_constant, 0 < N < 1                    dr_grpo, max_completion_length = N / B
        ppo   sum_over_constant, N >= 1                       dapo, num_items_in_batch = N
        cispo sum_over_constant, N >= 1                       cispo, num_items_in_batch = N
        any   seq_mean_token_mean_over_constant, N = B        as seq_mean_token_mean

    N < 1 goes to dr_grpo because the libraries floor num_items_in_batch at 1. `own_count`: the
    library counts the mask itself when num_items_in_batch is None (Liger), so the valid count is
    left to it, also where N equals it. `mask` is the [B, T] completion mask.
    """
    policy, aggregation = config["policy_loss"], config["aggregation"]
    batch, time = mask.shape
    normalizer = hparams["normalizer"]
    valid = mask.sum()
    if aggregation == "seq_mean_token_mean_over_constant":
        if normalizer != batch:
            refuse(library, f"aggregation={aggregation!r} with normalizer {normalizer} != B = {batch}: "
                            "the per-row mean of loss_type grpo and sapo divides by the batch size",
                            switch="aggregation", value=aggregation)
        aggregation = "seq_mean_token_mean"
    if policy == "sapo":
        if aggregation != "seq_mean_token_mean":
            refuse(library, f"policy_loss='sapo' with aggregation={aggregation!r}: loss_type sapo "
                            "averages like grpo (seq_mean_token_mean)", switch="policy_loss", value="sapo")
        return LossType("sapo")
    if aggregation == "seq_mean_token_mean":
        if policy == "cispo":
            refuse(library, "policy_loss='cispo' with seq_mean_token_mean: loss_type cispo divides by a "
                            "token count (num_items_in_batch)", switch="policy_loss", value="cispo")
        return LossType("grpo")
    if aggregation == "token_mean":
        if policy == "ppo":
            return LossType("bnpo")
        return LossType("cispo", num_items_in_batch=None if own_count else valid)
    if aggregation == "sum_over_constant":
        loss_type = "dapo" if policy == "ppo" else "cispo"
        if own_count and normalizer == float(valid) and normalizer >= 1.0:
            return LossType(loss_type)  # the library's own count of the mask
        if policy == "ppo" and normalizer == batch * time:
            return LossType("dr_grpo", max_completion_length=time)
        if normalizer >= 1.0:
            return LossType(loss_type, num_items_in_batch=normalizer)
        if policy == "ppo":
            return LossType("dr_grpo", max_completion_length=normalizer / batch)
        refuse(library, f"cispo with normalizer {normalizer} < 1: num_items_in_batch is floored at 1", switch=None)
    refuse(library, f"aggregation={aggregation!r}", switch="aggregation", value=aggregation)
