"""protocol.py: how an implementation's exception becomes a reply, a refusal's switch included."""

from grpo_kernels.objective import Refusal
from grpo_verify_worker import protocol


def failure(error):
    try:
        raise error
    except Exception as raised:
        return protocol.implementation_failure(raised)


def test_a_refusal_gives_its_switch_and_value_as_data():
    reply = protocol.error_reply(failure(Refusal("no sequence ratio", switch="ratio_level", value="sequence")))
    assert reply["error"] == "unsupported" and reply["switch"] == "ratio_level" and reply["value"] == "sequence"


def test_a_duck_typed_refusal_counts_and_a_bare_one_gives_no_switch():
    error = NotImplementedError("no")
    error.switch, error.value = "kl_estimator", object()
    reply = protocol.error_reply(failure(error))
    assert reply["switch"] == "kl_estimator" and isinstance(reply["value"], str)
    reply = protocol.error_reply(failure(NotImplementedError("logit_transform is not supported")))
    assert reply["error"] == "unsupported" and "switch" not in reply


def test_a_refusal_as_the_cause_is_still_a_refusal_with_its_switch():
    try:
        try:
            raise Refusal("no", switch="logit_transform", value=True)
        except Refusal as refusal:
            raise RuntimeError("while tracing") from refusal
    except RuntimeError as raised:
        error = protocol.implementation_failure(raised)
    assert error.kind == "unsupported" and error.switch == "logit_transform" and error.value is True


def test_any_other_exception_is_an_impl_error_without_a_switch():
    error = failure(ValueError("bad"))
    assert error.kind == "impl" and error.switch is None and "switch" not in protocol.error_reply(error)
