"""The adapter call of docs/spec.md, the same for every framework.

Both runners (runner.py for JAX, torch_runner.py for PyTorch) call an
implementation through `call` and name its outputs with `outputs`; they
differ only where the frameworks do: how inputs become arrays or tensors,
how the VJP is taken, how results come back to the host.
"""

import dataclasses

from grpo_verify_worker.protocol import AUX_KEYS, split_result


@dataclasses.dataclass(frozen=True)
class Outputs:
    """What a run sends back: its arrays by wire name, whether it compiled, the aux keys not compared."""

    compiled: bool
    arrays: list  # [(wire name, numpy array)]
    aux_ignored: list


def call(implementation, floats, others, hparams, config):
    """(loss, aux) of `implementation` on one request's inputs, as docs/spec.md calls it.

    floats: the float inputs in `implementation.float_params` order; others:
    the other arrays by name (old_logp, ref_logp, is_weights only when sent).
    A v2 implementation gets `is_weights` (None when absent); a v1 one never
    gets that keyword.
    """
    extra = {"is_weights": others.get("is_weights")} if implementation.spec_version >= 2 else {}
    result = implementation.function(
        **extra,
        **dict(zip(implementation.float_params, floats)),
        tokens=others["tokens"],
        mask=others["mask"],
        advantages=others["advantages"],
        old_logp=others.get("old_logp"),
        ref_logp=others.get("ref_logp"),
        hparams=hparams,
        config=dict(config),
    )
    return split_result(implementation.name, result)


def compared_aux(aux):
    """The aux entries the harness compares (AUX_KEYS, in that order), by key."""
    return {key: aux[key] for key in AUX_KEYS if key in aux}


def ignored_aux(aux):
    """The aux keys the harness does not compare, sorted (reported, never an error)."""
    return sorted(str(key) for key in aux if key not in AUX_KEYS)


def outputs(implementation, loss, grads, aux, to_host):
    """[(wire name, host array)]: "loss", "grad.<param>" per float input, "aux.<key>".

    to_host(value, what) brings one result to the host as a numpy array;
    `what` names it for an error ("the gradient of logits").
    """
    arrays = [("loss", to_host(loss, "the loss"))]
    arrays += [(f"grad.{n}", to_host(g, f"the gradient of {n}")) for n, g in zip(implementation.float_params, grads)]
    arrays += [(f"aux.{key}", to_host(value, f"aux[{key!r}]")) for key, value in compared_aux(aux).items()]
    return arrays
