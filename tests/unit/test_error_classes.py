"""The service's error classes: one per status code, named as tf.errors names them, re-typed as
tf.errors by the TensorFlow client (tf_errors.py), pickled whole (across processes)."""

import pickle

import pytest
import tensorflow as tf

from dataservice import errors, status, tf_errors


@pytest.mark.parametrize("code", [c for c in status.Code if c != status.Code.OK], ids=lambda c: c.name)
def test_each_code_has_a_class_named_as_tensorflows(code):
    error = status.error(code, "what happened")
    assert isinstance(error, errors.ServiceError)
    assert error.code == code and error.error_code == int(code) and error.message == "what happened"
    as_tf = tf_errors.as_tf_error(error)
    assert type(as_tf).__name__ == type(error).__name__
    assert as_tf.error_code == int(code) and as_tf.message == "what happened"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and copy.message == error.message


def test_a_number_no_code_has_is_unknown_and_the_decorator_retypes():
    assert type(status.error(99, "x")) is errors.UnknownError

    @tf_errors.raising_tf_errors
    def fails():
        raise errors.NotFoundError("no such dataset")

    with pytest.raises(tf.errors.NotFoundError, match="no such dataset"):
        fails()
