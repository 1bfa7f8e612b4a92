"""A custom operator that takes a while on MXNet's engine: the loop runs ahead of it."""

import time

import mxnet as mx


def register_slow_identity(op_type, seconds, forwards):
    """Register ``op_type``: the identity, sleeping ``seconds`` in each forward pass on
    the engine and then appending to the list ``forwards`` (the passes the engine ran)."""

    class SlowIdentity(mx.operator.CustomOp):
        def forward(self, is_train, req, in_data, out_data, aux):
            time.sleep(seconds)
            self.assign(out_data[0], req[0], in_data[0])
            forwards.append(1)

        def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
            self.assign(in_grad[0], req[0], out_grad[0])

    @mx.operator.register(op_type)
    class SlowIdentityProp(mx.operator.CustomOpProp):
        def __init__(self):
            super().__init__(need_top_grad=True)

        def infer_shape(self, in_shape):
            return in_shape, in_shape, []

        def create_operator(self, ctx, shapes, dtypes):
            return SlowIdentity()

    return SlowIdentityProp
