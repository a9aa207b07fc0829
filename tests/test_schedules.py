"""schedules.py: values at known steps (t = step + 1), config round-trip, use inside a compiled fit."""

import math

import keras
import numpy as np
import pytest
from conftest import to_numpy

from schedules import InverseSquareRoot, LinearDecay, LinearWarmup, StepDecay


def lr_at(schedule, step):
    return float(to_numpy(schedule(step)))


def fairseq_inverse_sqrt(lr, warmup, step):
    """fairseq's inverse_sqrt with warmup_init_lr 0, evaluated for update t = step + 1."""
    t = step + 1
    return lr * t / warmup if t < warmup else lr * math.sqrt(warmup / t)


@pytest.mark.parametrize("step", [0, 1, 999, 3998, 3999, 4000, 15999, 100000])
def test_warmup_then_inverse_sqrt(step):
    schedule = LinearWarmup(4000, InverseSquareRoot(5e-4, decay_start=4000))
    assert lr_at(schedule, step) == pytest.approx(fairseq_inverse_sqrt(5e-4, 4000, step), rel=1e-5)


def test_known_values_and_step_counting():
    schedule = LinearWarmup(4000, InverseSquareRoot(5e-4, decay_start=4000))
    assert lr_at(schedule, 0) == pytest.approx(5e-4 / 4000)  # first update: t = 1
    assert lr_at(schedule, 3999) == pytest.approx(5e-4)  # update T reaches the peak
    assert lr_at(schedule, 15999) == pytest.approx(2.5e-4)  # t = 16000 = 4T: half the peak
    # The paper's "warmup = 1" (Figure 2): lr_max from the first update, then lr_max / sqrt(t).
    no_warmup = LinearWarmup(1, InverseSquareRoot(1e-3, decay_start=1))
    assert lr_at(no_warmup, 0) == pytest.approx(1e-3)
    assert lr_at(no_warmup, 3) == pytest.approx(1e-3 / 2)
    assert lr_at(InverseSquareRoot(1e-3, decay_start=1), 99) == pytest.approx(1e-4)
    # warmup_steps=0 is the schedule after it.
    assert lr_at(LinearWarmup(0, 7e-4), 0) == pytest.approx(7e-4)
    # Warmup from a non-zero initial lr, into a constant.
    warm = LinearWarmup(10, 1e-3, initial_lr=1e-4)
    assert lr_at(warm, 4) == pytest.approx(1e-4 + 0.9e-3 * 5 / 10)
    assert lr_at(warm, 50) == pytest.approx(1e-3)


def test_step_decay_pre_ln_iwslt():
    steps_per_epoch = 1100
    schedule = StepDecay(5e-4, boundaries=[8 * steps_per_epoch], factor=0.1)
    assert lr_at(schedule, 0) == pytest.approx(5e-4)
    assert lr_at(schedule, 8 * steps_per_epoch - 1) == pytest.approx(5e-4)  # last update of epoch 8
    assert lr_at(schedule, 8 * steps_per_epoch) == pytest.approx(5e-5)  # first update of epoch 9
    two = StepDecay(1.0, boundaries=[10, 20], factor=0.5)
    assert [lr_at(two, s) for s in (9, 10, 19, 20, 1000)] == pytest.approx([1.0, 0.5, 0.5, 0.25, 0.25])


def test_decay_at_a_step_then_inverse_sqrt():
    schedule = InverseSquareRoot(7.5e-4, decay_start=8000)
    assert lr_at(schedule, 0) == pytest.approx(7.5e-4)
    assert lr_at(schedule, 7998) == pytest.approx(7.5e-4)
    assert lr_at(schedule, 31999) == pytest.approx(7.5e-4 / 2)
    dropped = InverseSquareRoot(1.5e-3, decay_start=100, factor=0.1)
    assert lr_at(dropped, 98) == pytest.approx(1.5e-3)
    assert lr_at(dropped, 99) == pytest.approx(1.5e-4)
    assert lr_at(dropped, 399) == pytest.approx(0.75e-4)


def test_linear_decay_with_and_without_warmup():
    pre = LinearDecay(3e-4, total_steps=1000)
    assert lr_at(pre, 0) == pytest.approx(3e-4 * 999 / 1000)
    assert lr_at(pre, 499) == pytest.approx(1.5e-4)
    assert lr_at(pre, 999) == pytest.approx(0.0, abs=1e-12)
    assert lr_at(pre, 5000) == pytest.approx(0.0, abs=1e-12)
    post = LinearWarmup(100, LinearDecay(1e-4, total_steps=1100, decay_start=100))
    assert lr_at(post, 49) == pytest.approx(0.5e-4)
    assert lr_at(post, 99) == pytest.approx(1e-4)
    assert lr_at(post, 599) == pytest.approx(0.5e-4)
    assert lr_at(post, 1099) == pytest.approx(0.0, abs=1e-12)


ALL = {
    "warmup_inverse_sqrt": lambda: LinearWarmup(40, InverseSquareRoot(5e-4, decay_start=40), initial_lr=1e-7),
    "warmup_linear": lambda: LinearWarmup(5, LinearDecay(1e-4, total_steps=50, decay_start=5, end_lr=1e-6)),
    "step": lambda: StepDecay(5e-4, [3, 9], factor=0.5),
    "inverse_sqrt": lambda: InverseSquareRoot(1e-3, decay_start=7, factor=0.5),
    "warmup_constant": lambda: LinearWarmup(3, 2e-4),
}


@pytest.mark.parametrize("name", sorted(ALL))
def test_config_round_trip(name):
    schedule = ALL[name]()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert type(restored) is type(schedule)
    assert restored.get_config() == schedule.get_config()
    for step in (0, 2, 3, 10, 45, 100):
        assert lr_at(restored, step) == pytest.approx(lr_at(schedule, step))


@pytest.mark.parametrize("name", ["warmup_inverse_sqrt", "step"])
def test_schedule_inside_compiled_fit(name):
    """The optimizer evaluates the schedule in the compiled train step; after n updates it reports lr(n)."""
    schedule = ALL[name]()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse", jit_compile=keras.backend.backend() != "torch")
    x, y = np.ones((20, 3), "float32"), np.zeros((20, 1), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)  # 10 updates
    assert int(to_numpy(model.optimizer.iterations)) == 10
    assert float(to_numpy(model.optimizer.learning_rate)) == pytest.approx(lr_at(schedule, 10), rel=1e-6)
    # A warmup model's weights moved by exactly the scheduled learning rates: check the first update.
    model2 = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model2.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    model2.fit(np.ones((1, 1), "float32"), np.ones((1, 1), "float32"), batch_size=1, epochs=1, verbose=0)
    # mse gradient at w = 0, x = 1, y = 1 is -2: w_1 = 2 lr(0).
    assert float(to_numpy(model2.weights[0])[0, 0]) == pytest.approx(2 * lr_at(schedule, 0), rel=1e-5)


@pytest.mark.parametrize("make, message", [
    (lambda: LinearWarmup(-1, 1e-3), "warmup_steps must be a number >= 0"),
    (lambda: LinearWarmup(10, "fast"), "after must be a LearningRateSchedule or a number"),
    (lambda: LinearWarmup(10, -1e-3), "must be a number > 0"),
    (lambda: InverseSquareRoot(0.0, 10), "lr must be a number > 0"),
    (lambda: InverseSquareRoot(1e-3, 0), "decay_start must be a number >= 1"),
    (lambda: StepDecay(1e-3, [10, 5]), "boundaries must be increasing"),
    (lambda: StepDecay(1e-3, [10], factor=0), "factor must be a number > 0"),
    (lambda: LinearDecay(1e-3, total_steps=0), "total_steps must be a number >= 1"),
    (lambda: LinearDecay(1e-3, total_steps=100, decay_start=200), "warmup longer than training"),
])
def test_bad_schedule_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()
