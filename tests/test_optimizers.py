"""optimizers.py: RAdam against a NumPy reference (both branches), schedules, weight decay,
config round trip, use inside a compiled fit, state saved in a .keras file. Backend-agnostic."""

import math

import keras
import numpy as np
import pytest
from conftest import to_numpy

from optimizers import RAdam, approx_sma_length

STEPS = 12
SHAPES = [(5,), (3, 4)]  # a vector and a matrix


def reference_radam(thetas, grads_per_step, lr=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-8, threshold=4.0,
                    weight_decay=None):
    """Liu et al. (2019), Algorithm 2, in float64. `lr` is a number or a function of the 0-based step.
    Yields (t, rho_t, thetas, ms, vs) after each step t = 1, 2, ..."""
    thetas = [np.array(x, np.float64) for x in thetas]
    ms = [np.zeros_like(x) for x in thetas]
    vs = [np.zeros_like(x) for x in thetas]
    rho_inf = 2.0 / (1.0 - beta_2) - 1.0
    for step, grads in enumerate(grads_per_step):
        t = step + 1
        lr_t = lr(step) if callable(lr) else lr
        rho_t = rho_inf - 2.0 * t * beta_2**t / (1.0 - beta_2**t)
        for i, g in enumerate(grads):
            if weight_decay:  # decoupled, before the step (Keras's base optimizer)
                thetas[i] = thetas[i] - thetas[i] * weight_decay * lr_t
            ms[i] = beta_1 * ms[i] + (1.0 - beta_1) * g
            vs[i] = beta_2 * vs[i] + (1.0 - beta_2) * g**2
            m_hat = ms[i] / (1.0 - beta_1**t)
            if rho_t > threshold:
                l_t = math.sqrt(1.0 - beta_2**t) / (np.sqrt(vs[i]) + epsilon)
                r_t = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                thetas[i] = thetas[i] - lr_t * r_t * m_hat * l_t
            else:
                thetas[i] = thetas[i] - lr_t * m_hat
        yield t, rho_t, [x.copy() for x in thetas], ms, vs


def fixed_problem(seed=0):
    rng = np.random.RandomState(seed)
    thetas = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    return thetas, grads


def run_against_reference(optimizer, ref_kwargs, rtol=1e-5):
    thetas, grads = fixed_problem()
    variables = [keras.Variable(x) for x in thetas]
    previous = [(x, np.array(x, np.float64)) for x in thetas]  # (got, reference) at t - 1
    rhos = []
    for (t, rho_t, ref_thetas, ref_ms, ref_vs), step_grads in zip(reference_radam(thetas, grads, **ref_kwargs),
                                                                   grads):
        optimizer.apply_gradients(zip([keras.ops.convert_to_tensor(g) for g in step_grads], variables))
        assert int(to_numpy(optimizer.iterations)) == t
        for i, var in enumerate(variables):
            got = to_numpy(var)
            np.testing.assert_allclose(got, ref_thetas[i], rtol=rtol, atol=1e-7, err_msg=f"theta, t={t}")
            # The update itself (~1e-3 in the rectified steps, small next to theta), so that an error in
            # r_t or l_t cannot hide; atol covers float32 rounding of theta.
            np.testing.assert_allclose(got - previous[i][0], ref_thetas[i] - previous[i][1], rtol=1e-4, atol=1e-6,
                                       err_msg=f"update, t={t}")
            previous[i] = (got, ref_thetas[i])
            index = optimizer._get_variable_index(var)
            np.testing.assert_allclose(to_numpy(optimizer._momentums[index]), ref_ms[i], rtol=rtol, atol=1e-7)
            np.testing.assert_allclose(to_numpy(optimizer._velocities[index]), ref_vs[i], rtol=rtol, atol=1e-9)
        rhos.append(rho_t)
    return np.array(rhos)


def test_rho_crosses_the_threshold_at_step_5():
    """beta_2 = 0.999: rho_1..rho_4 <= 4 (momentum SGD), rho_5 ~ 4.996 > 4 (rectified)."""
    t = np.arange(1, STEPS + 1, dtype=np.float64)
    exact = 2 / 0.001 - 1 - 2 * t * 0.999**t / (1 - 0.999**t)
    assert np.all(exact[:4] <= 4) and np.all(exact[4:] > 4)
    assert exact[0] == pytest.approx(1.0) and exact[4] == pytest.approx(4.996, abs=1e-3)
    np.testing.assert_allclose(to_numpy(approx_sma_length(t, 0.999)), exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("beta_2", [0.98, 0.999, 0.9999])
def test_rho_has_no_float32_cancellation(beta_2):
    t = np.array([1, 2, 3, 4, 5, 6, 10, 100, 1000, 10000, 100000], np.float64)
    exact = 2 / (1 - beta_2) - 1 - 2 * t * beta_2**t / (1 - beta_2**t)
    np.testing.assert_allclose(to_numpy(approx_sma_length(t, beta_2)), exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("threshold", [4.0, 5.0])
def test_matches_numpy_reference_in_both_branches(threshold):
    optimizer = RAdam(learning_rate=0.1, rectification_threshold=threshold)
    rhos = run_against_reference(optimizer, dict(lr=0.1, threshold=threshold))
    momentum_steps = 4 if threshold == 4.0 else 5  # rho_5 ~ 4.996
    assert np.sum(rhos <= threshold) == momentum_steps  # both branches were taken
    assert np.sum(rhos > threshold) == STEPS - momentum_steps


def test_first_step_is_plain_sgd():
    """rho_1 = 1 <= 4 and m_hat_1 = g_1: theta_1 = theta_0 - lr g_1."""
    theta = np.array([1.0, -2.0, 3.0], np.float32)
    grad = np.array([0.5, 0.25, -1.0], np.float32)
    var = keras.Variable(theta)
    RAdam(learning_rate=0.1).apply_gradients([(keras.ops.convert_to_tensor(grad), var)])
    np.testing.assert_allclose(to_numpy(var), theta - 0.1 * grad, rtol=1e-6)


@pytest.mark.parametrize("with_schedule,weight_decay", [(True, None), (False, 0.05), (True, 0.05)])
def test_schedule_and_weight_decay(with_schedule, weight_decay):
    if with_schedule:
        learning_rate = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=3, decay_rate=0.5)
        lr = lambda step: 0.1 * 0.5 ** (step / 3)  # noqa: E731  (Keras calls it with the 0-based step)
    else:
        learning_rate = lr = 0.1
    optimizer = RAdam(learning_rate=learning_rate, beta_1=0.8, beta_2=0.99, epsilon=1e-6,
                      weight_decay=weight_decay)
    run_against_reference(optimizer, dict(lr=lr, beta_1=0.8, beta_2=0.99, epsilon=1e-6, weight_decay=weight_decay))


def test_config_round_trip():
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-3, decay_steps=100, decay_rate=0.9)
    optimizer = RAdam(learning_rate=schedule, beta_1=0.8, beta_2=0.98, epsilon=1e-6, rectification_threshold=5.0,
                      weight_decay=0.01, global_clipnorm=1.0, name="radam_test")
    config = optimizer.get_config()
    for key, value in dict(beta_1=0.8, beta_2=0.98, epsilon=1e-6, rectification_threshold=5.0, weight_decay=0.01,
                           global_clipnorm=1.0, name="radam_test").items():
        assert config[key] == value
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored, RAdam)
    assert restored.get_config() == config
    assert isinstance(restored._learning_rate, keras.optimizers.schedules.ExponentialDecay)
    plain = RAdam()
    assert keras.optimizers.deserialize(keras.optimizers.serialize(plain)).get_config() == plain.get_config()


@pytest.mark.parametrize("kwargs", [dict(beta_1=1.0), dict(beta_2=0.0), dict(beta_2=1.0), dict(epsilon=-1.0),
                                    dict(rectification_threshold=3.0)])
def test_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        RAdam(**kwargs)


def regression_data(n=64):
    rng = np.random.RandomState(0)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.1).astype(np.float32)
    return x, y


def compiled_model(optimizer):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    jit = False if keras.backend.backend() == "torch" else "auto"
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit)
    return model


def test_fit_decreases_loss():
    x, y = regression_data()
    model = compiled_model(RAdam(learning_rate=0.1))
    losses = np.array(model.fit(x, y, batch_size=16, epochs=6, verbose=0, shuffle=False).history["loss"])
    assert np.all(np.isfinite(losses))
    assert np.all(np.diff(losses) < 0), losses
    assert losses[-1] < 0.5 * losses[0], losses
    assert int(to_numpy(model.optimizer.iterations)) == 6 * 4


def test_state_survives_keras_file(tmp_path):
    x, y = regression_data()
    model = compiled_model(RAdam(learning_rate=0.03, rectification_threshold=5.0, weight_decay=0.01))
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    path = str(tmp_path / "radam.keras")
    model.save(path)
    loaded = keras.models.load_model(path)

    assert isinstance(loaded.optimizer, RAdam)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert int(to_numpy(loaded.optimizer.iterations)) == int(to_numpy(model.optimizer.iterations)) == 8
    slots = lambda opt: [to_numpy(s) for s in opt._momentums + opt._velocities]  # noqa: E731
    assert len(slots(loaded.optimizer)) == 2 * len(model.trainable_variables)
    for before, after in zip(slots(model.optimizer), slots(loaded.optimizer)):
        assert np.any(before != 0)
        np.testing.assert_array_equal(after, before)
    # Training goes on identically from the restored state.
    model.train_on_batch(x[:16], y[:16])
    loaded.train_on_batch(x[:16], y[:16])
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
