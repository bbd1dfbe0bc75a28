"""The job's first lines say how much memory each process holds for the model."""

import paddle
from paddle import nn

from {{ cookiecutter.project_slug }} import engine


def test_a_process_holds_parameters_gradients_and_the_optimizers_state_per_parameter():
    model = nn.Linear(10, 10)  # 110 parameters: 440 bytes in float32

    assert engine.training_memory(model, paddle.optimizer.SGD(parameters=model.parameters())) == (110, 440 * 2)
    assert engine.training_memory(model, paddle.optimizer.Momentum(parameters=model.parameters())) == (110, 440 * 3)
    assert engine.training_memory(model, paddle.optimizer.AdamW(parameters=model.parameters())) == (110, 440 * 4)


def test_measuring_it_draws_nothing_from_the_random_stream_a_resumed_run_restored():
    # The line is logged after resume() restored the random streams: dropout's masks must go on as if never stopped.
    model = nn.Linear(10, 10)
    restored = paddle.get_rng_state("cpu")
    engine.training_memory(model, paddle.optimizer.AdamW(parameters=model.parameters()))
    drawn = paddle.rand([4]).numpy()
    paddle.set_rng_state(restored, "cpu")

    assert (drawn == paddle.rand([4]).numpy()).all()
