"""MPPI planner behaviour on a toy world model whose optimum is known in closed form.

`QuadraticToyModel` implements the world-model API honestly (it is a tiny analytic model, not a
mock): the latent is a point in action space, f integrates the actions (z_{k+1} = z_k + a_k, one
cumsum for the whole chunk), R = -w_r ||a - a*||^2 and V = -w_v ||z - z*||^2.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from simdist_planner.model.config import (
    UR5E_CAMERAS,
    ImageEncoderConfig,
    go2_config,
    ur5e_small_config,
)
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning.config import (
    GO2_TEMPERATURE,
    PROJECT_RETURN,
    PlannerConfig,
    go2_planner_config,
    official_planner_config,
    ur5e_planner_config,
)
from simdist_planner.planning.planner import MPPIPlanner, Planner, PlannerError, make_planner
from test_world_model import count_kv_rows

A, H = 2, 3


class QuadraticToyModel:
    def __init__(self, target, reward_weight=1.0, value_weight=0.0, value_target=None, policy=None):
        self.target = torch.as_tensor(target, dtype=torch.float32)
        self.reward_weight = reward_weight
        self.value_weight = value_weight
        self.value_target = (
            torch.zeros(len(target)) if value_target is None else torch.as_tensor(value_target)
        )
        self.policy_chunk = policy  # (T, A) or None -> zeros
        self.nan_reward_where = None  # callable(actions) -> bool mask (N, T) of NaN rewards
        self.nan_in = set()  # names of methods whose output is all NaN
        self.recorded: list[torch.Tensor] | None = None  # actions passed to dynamics, if recording

    def encode(self, obs):
        return self._maybe_nan("encode", obs["proprio"].float())

    def encode_history(self, proprio, actions):
        return self._maybe_nan("encode_history", torch.cat([proprio, actions], dim=1))

    def dynamics_context(self, z, history):
        return None  # the toy f has no attention to cache

    def dynamics(self, z, actions, history, context=None):
        if self.recorded is not None:
            self.recorded.append(actions.clone())
        return self._maybe_nan("dynamics", z.unsqueeze(1) + actions.cumsum(1))

    def reward(self, latents, actions, command):
        r = -self.reward_weight * (actions - self.target).square().sum(-1)
        if self.nan_reward_where is not None:
            r = torch.where(self.nan_reward_where(actions), torch.nan, r)
        return self._maybe_nan("reward", r)

    def value(self, latents, command):
        return self._maybe_nan(
            "value", -self.value_weight * (latents[:, 1:] - self.value_target).square().sum(-1)
        )

    def policy(self, z, history, command, proprio):
        T = self.horizon
        chunk = (
            torch.zeros(T, A) if self.policy_chunk is None else torch.as_tensor(self.policy_chunk)
        )
        return self._maybe_nan("policy", chunk.to(z.device).expand(z.shape[0], T, A).clone())

    def _maybe_nan(self, name, out):
        return torch.full_like(out, torch.nan) if name in self.nan_in else out


def make(model, horizon=5, **overrides):
    """A planner on the toy model with the project's return (PROJECT_RETURN) unless overridden."""
    settings = dict(
        horizon=horizon,
        action_low=(-1.0,) * A,
        action_high=(1.0,) * A,
        num_samples=256,
        **PROJECT_RETURN,
    )
    settings.update(overrides)
    model.horizon = horizon
    return MPPIPlanner(model, PlannerConfig(**settings))


def inputs(z0=(0.0, 0.0)):
    obs = {"proprio": torch.tensor([z0], dtype=torch.float32)}
    return obs, torch.zeros(1, H, A), torch.zeros(1, H, A)


def test_action_converges_to_known_optimum():
    target = [0.3, -0.5]
    planner = make(QuadraticToyModel(target))
    for _ in range(6):  # warm start carries the solution across steps
        result = planner.plan(*inputs())
    np.testing.assert_allclose(result.action, target, atol=0.05)
    np.testing.assert_allclose(result.mean, np.tile(target, (5, 1)), atol=0.1)
    assert result.action.shape == (A,) and result.nonfinite_candidates == 0
    assert result.timings.total_s >= result.timings.optimise_s > 0


def test_make_planner_builds_what_the_protocol_names_and_plans_like_the_planner_itself():
    direct = make(QuadraticToyModel([0.3, -0.5]))
    model = QuadraticToyModel([0.3, -0.5])
    model.horizon = direct.config.horizon
    built = make_planner(direct.config, model)
    members = {n for n in vars(Planner) if not n.startswith("_")} | set(Planner.__annotations__)
    assert {"plan", "reset", "score", "objective", "evaluator", "config", "model"} <= members
    assert all(hasattr(built, n) for n in members) and built.config is direct.config
    for _ in range(2):  # the warm start carries over: both follow the same steps
        a, b = built.plan(*inputs()), direct.plan(*inputs())
        np.testing.assert_array_equal(a.mean, b.mean)
        assert a.expected_return == b.expected_return


@pytest.mark.parametrize("offset", [0, 1])
def test_value_tail_and_discount_match_hand_computation(offset):
    # T = 2, 1-D trade-off: J(a) = -(a0-1)^2 - g (a1-1)^2 - g^(2+o) wv (a0 + a1 - b)^2, with
    # o = value_discount_offset (0: METHOD_NOTES, 1: the official controller).
    gamma, wv, b = 0.5, 1.0, -1.0
    model = QuadraticToyModel([1.0, 1.0], value_weight=wv, value_target=[b, b])
    planner = make(
        model,
        horizon=2,
        value_discount_offset=offset,
        discount=gamma,
        num_samples=1000,
        num_elites=64,
        temperature=10.0,
        iterations=20,
        min_std=0.005,
    )
    result = planner.plan(*inputs())
    # Stationary point of J per dimension: solve the 2x2 linear system.
    g2w = gamma ** (2 + offset) * wv
    M = np.array([[1 + g2w, g2w], [g2w, gamma + g2w]])
    optimum = np.linalg.solve(M, [1 + g2w * b, gamma + g2w * b])
    np.testing.assert_allclose(result.mean, np.stack([optimum, optimum], axis=1), atol=0.01)
    # The reported return of the mean chunk, recomputed by hand from the toy model's formulas.
    a = result.mean.astype(np.float64)
    states = np.cumsum(a, axis=0)
    r = -((a - 1.0) ** 2).sum(1)
    v = -wv * ((states - b) ** 2).sum(1)
    np.testing.assert_allclose(result.rewards, r, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.values, v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        result.expected_return, r[0] + gamma * r[1] + gamma ** (2 + offset) * v[-1], rtol=1e-5
    )


def test_score_is_the_objective_the_planner_maximises():
    gamma = 0.9
    model = QuadraticToyModel([0.3, -0.5], value_weight=0.5, value_target=[1.0, 0.0])
    planner = make(model, horizon=3, discount=gamma)
    result = planner.plan(*inputs())
    chunks = torch.stack([torch.as_tensor(result.mean), torch.zeros(3, A), torch.full((3, A), 0.9)])
    scores = planner.score(*inputs(), chunks).numpy()
    assert scores.shape == (3,)
    np.testing.assert_allclose(
        scores[0], result.expected_return, rtol=1e-5
    )  # the plan's own return
    a = chunks[2].double().numpy()  # by hand for the constant chunk
    r = -((a - [0.3, -0.5]) ** 2).sum(1)
    v_end = -0.5 * ((a.sum(0) - [1.0, 0.0]) ** 2).sum()
    np.testing.assert_allclose(scores[2], r @ gamma ** np.arange(3) + gamma**3 * v_end, rtol=1e-5)
    assert scores[0] > scores[1] and scores[0] > scores[2]  # MPPI found the better chunk
    model.nan_in.add("value")
    with pytest.raises(PlannerError, match="non-finite objective for 3 of 3 chunks"):
        planner.score(*inputs(), chunks)


def test_warm_start_shifts_previous_mean_by_delay():
    model = QuadraticToyModel([0.0, 0.0])
    # A tiny std makes the first iteration's Gaussian candidates equal to the warm-start mean.
    planner = make(
        model, horizon=6, mixture_coef=0.0, init_std=1e-6, min_std=1e-6, delay=2, num_elites=8
    )
    planner._mean.copy_(torch.linspace(-0.6, 0.6, 12).view(6, 2))  # a known previous plan
    expected = torch.zeros(6, 2)
    expected[:4] = planner._mean[2:]
    model.recorded = []
    planner.plan(*inputs())
    first_candidates = model.recorded[0]
    torch.testing.assert_close(first_candidates.mean(0), expected, atol=1e-5, rtol=0)


def test_replan_period_executes_the_plan_between_plans_and_shifts_the_warm_start_by_it():
    """replan_period k: f is called on every k-th step only; the steps between execute the plan's
    next actions in order; the next plan's warm start is the plan shifted by the k steps run."""
    model = QuadraticToyModel([0.0, 0.0])
    planner = make(model, horizon=6, mixture_coef=0.0, init_std=1e-6, min_std=1e-6, replan_period=3)
    planner._mean.copy_(torch.linspace(-0.6, 0.6, 12).view(6, 2))
    model.recorded = []
    first = planner.plan(*inputs())
    calls = len(model.recorded)
    assert calls > 0
    steps = [planner.plan(*inputs()) for _ in range(2)]
    assert len(model.recorded) == calls  # no model call between plans
    for k, step in enumerate(steps, start=1):
        np.testing.assert_array_equal(step.action, first.mean[k])
        np.testing.assert_array_equal(step.mean, first.mean)
        assert step.timings.total_s == 0
    planned_mean = planner._mean.clone()
    expected = torch.zeros(6, 2)
    expected[:3] = planned_mean[3:]  # shift by delay + replan_period - 1 = 3
    model.recorded = []
    again = planner.plan(*inputs())  # the 4th step plans again
    assert again.timings.total_s > 0
    torch.testing.assert_close(model.recorded[0].mean(0), expected, atol=1e-5, rtol=0)
    planner.reset()
    model.recorded = []
    planner.plan(*inputs())  # an episode start always plans
    assert len(model.recorded) > 0


def test_replan_period_one_is_the_plan_of_every_step():
    a = make(QuadraticToyModel([0.3, -0.5]))
    b = make(QuadraticToyModel([0.3, -0.5]), replan_period=1)
    for _ in range(3):
        np.testing.assert_array_equal(a.plan(*inputs()).mean, b.plan(*inputs()).mean)


def test_replan_period_is_validated_against_the_horizon():
    with pytest.raises(ValueError, match="replan_period must be in"):
        make(QuadraticToyModel([0.0, 0.0]), horizon=5, replan_period=6)
    with pytest.raises(ValueError, match="delay \\+ replan_period - 1"):
        make(QuadraticToyModel([0.0, 0.0]), horizon=5, replan_period=4, delay=3)


def test_roll_warm_start_keeps_the_last_rows_first_and_zeros_the_rest():
    """The official controller: jnp.roll(prev, delay) then zero from `delay` on."""
    model = QuadraticToyModel([0.0, 0.0])
    planner = make(
        model,
        horizon=6,
        warm_start="roll",
        mixture_coef=0.0,
        init_std=1e-6,
        min_std=1e-6,
        delay=2,
        num_elites=8,
    )
    planner._mean.copy_(torch.linspace(-0.6, 0.6, 12).view(6, 2))
    expected = torch.zeros(6, 2)
    expected[:2] = planner._mean[4:]
    model.recorded = []
    planner.plan(*inputs())
    torch.testing.assert_close(model.recorded[0].mean(0), expected, atol=1e-5, rtol=0)


def test_policy_warm_start_starts_every_step_at_pi_chunk():
    chunk = torch.linspace(-0.5, 0.5, 6 * A).view(6, A)
    model = QuadraticToyModel([0.0, 0.0], policy=chunk)
    planner = make(
        model,
        horizon=6,
        mixture_coef=0.0,
        init_std=1e-6,
        min_std=1e-6,
        num_elites=8,
        warm_start="policy",
    )
    planner._mean.copy_(torch.full((6, A), 0.9))  # a previous plan the policy start ignores
    model.recorded = []
    planner.plan(*inputs())
    torch.testing.assert_close(model.recorded[0].mean(0), chunk, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="warm_start"):
        PlannerConfig(
            horizon=6, action_low=(-1.0,) * A, action_high=(1.0,) * A, warm_start="previous"
        )


def test_policy_prior_trades_the_objective_against_distance_from_pi():
    # Per step: -||a - a*||^2 - (w / T) ||(a - c) / u||^2 (discount 1), so the optimum is
    # (a* + k c) / (1 + k) with k = w / (T u^2); w = 0 is the official planner, which finds a*.
    target, chunk = np.array([0.6, -0.4]), np.array([-0.2, 0.2])
    T, unit = 5, 0.5
    for w, k in ((0.0, 0.0), (5.0 * unit**2, 1.0), (15.0 * unit**2, 3.0)):
        model = QuadraticToyModel(
            target, policy=torch.tensor(np.tile(chunk, (T, 1)), dtype=torch.float32)
        )
        planner = make(
            model,
            horizon=T,
            discount=1.0,
            policy_prior=w,
            std_scale=(unit,) * A,
            init_std=1.0,
            min_std=0.01,
            num_samples=1000,
            num_elites=64,
            temperature=10.0,
            iterations=40,
        )
        result = planner.plan(*inputs())
        expected = (target + k * chunk) / (1 + k)
        np.testing.assert_allclose(
            result.mean, np.tile(expected, (T, 1)), atol=0.01, err_msg=f"policy_prior={w}"
        )
        # the reported rewards are the model's own, without the prior's cost
        np.testing.assert_allclose(
            result.rewards, -((result.mean - target) ** 2).sum(1), rtol=1e-5, atol=1e-6
        )
    # the distance is in std units, summed over the action and averaged over the horizon
    chunks = torch.zeros(2, T, A)
    chunks[1, 0] = torch.tensor([0.5, 0.0])  # one step 0.5 (one unit) off in one dimension
    d = planner.policy_distance(chunks, torch.zeros(T, A))
    torch.testing.assert_close(d, torch.tensor([0.0, 1.0 / T]))
    with pytest.raises(ValueError, match="policy_prior must be >= 0"):
        PlannerConfig(horizon=T, action_low=(-1.0,) * A, action_high=(1.0,) * A, policy_prior=-1.0)


def test_base_policy_candidates_are_noised_and_scored_once_per_step():
    """pi's noised chunks are drawn once per step and scored in the first iteration only; every
    refit still ranks them, with the returns of that first scoring."""
    chunk = torch.full((5, A), 0.4)
    model = QuadraticToyModel([0.0, 0.0], policy=chunk)
    planner = make(model, num_samples=100, mixture_coef=0.1, policy_noise_std=0.05, iterations=3)
    refits = []
    update = planner._update
    planner._update = lambda returns: (refits.append(returns.clone()), update(returns))
    model.recorded = []
    result = planner.plan(*inputs())
    scored = model.recorded[:3]  # the fourth call is the final mean's prediction
    assert [c.shape[0] for c in scored] == [110, 100, 100]
    policy_rows = scored[0][100:]
    assert 0.02 < (policy_rows - chunk).std() < 0.1
    expected = -(policy_rows - model.target).square().sum(-1) @ planner._discounts  # toy return
    assert [r.shape[0] for r in refits] == [110] * 3
    for returns in refits:
        torch.testing.assert_close(returns[100:], expected)
    np.testing.assert_allclose(result.policy_chunk, chunk.numpy())


def test_std_scale_sets_the_unit_of_every_std_per_dimension():
    """UR5e: stds in half action ranges. The first Gaussian candidates spread by init_std x
    unit, the policy candidates by policy_noise_std x unit, and the std floor is min_std x
    unit (a zero-reward model leaves the elites' own spread, so the floor shows)."""
    unit = (0.05, 0.5)
    model = QuadraticToyModel([0.0, 0.0], reward_weight=0.0, policy=torch.zeros(5, A))
    planner = make(
        model,
        action_low=(-1.0,) * A,
        action_high=(1.0,) * A,
        num_samples=2000,
        mixture_coef=0.5,
        init_std=0.2,
        policy_noise_std=0.1,
        min_std=0.5,
        num_elites=8,
        iterations=1,
        std_scale=unit,
    )
    model.recorded = []
    planner.plan(*inputs())
    first = model.recorded[0]
    torch.testing.assert_close(
        first[:2000].std(dim=(0, 1)), 0.2 * torch.tensor(unit), rtol=0.05, atol=0
    )
    torch.testing.assert_close(
        first[2000:].std(dim=(0, 1)), 0.1 * torch.tensor(unit), rtol=0.05, atol=0
    )
    # the elites spread less than the floor in both dimensions: the std is the floor itself
    torch.testing.assert_close(planner._std, (0.5 * torch.tensor(unit)).expand(5, A))
    ur5e = ur5e_planner_config([-0.05, -0.5, 0.0], [0.05, 0.5, 1.0])
    assert ur5e.std_scale == pytest.approx((0.05, 0.5, 0.5))
    assert go2_planner_config([-5.0] * 12, [5.0] * 12).std_scale == ()  # raw policy-action units
    with pytest.raises(ValueError, match="std_scale"):
        PlannerConfig(horizon=5, action_low=(-1.0,), action_high=(1.0,), std_scale=(1.0, 1.0))
    with pytest.raises(ValueError, match="std_scale"):
        PlannerConfig(horizon=5, action_low=(-1.0,), action_high=(1.0,), std_scale=(0.0,))


def test_actions_respect_bounds():
    model = QuadraticToyModel([3.0, -3.0])  # optimum outside the box
    planner = make(model, action_low=(-1.0, -0.5), action_high=(0.8, 1.0))
    model.recorded = []
    for _ in range(3):
        result = planner.plan(*inputs())
    candidates = torch.cat(model.recorded)
    assert candidates[..., 0].min() >= -1.0 and candidates[..., 0].max() <= 0.8
    assert candidates[..., 1].min() >= -0.5 and candidates[..., 1].max() <= 1.0
    np.testing.assert_allclose(result.action, [0.8, -0.5], atol=0.02)


def test_unclamped_planner_leaves_the_bounds_to_the_objective():
    """clamp_actions=False (official): candidates and the mean go where the objective wants."""
    model = QuadraticToyModel([3.0, -3.0])
    planner = make(model, clamp_actions=False, init_std=2.0, iterations=8)
    model.recorded = []
    for _ in range(6):
        result = planner.plan(*inputs())
    assert torch.cat(model.recorded).abs().max() > 1.0
    np.testing.assert_allclose(result.action, [3.0, -3.0], atol=0.1)


def test_deterministic_per_seed():
    def run(seed):
        planner = make(QuadraticToyModel([0.3, -0.2]), num_samples=64, iterations=2, num_elites=8)
        planner.reset(seed)
        return np.stack([planner.plan(*inputs()).action for _ in range(3)])

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


@pytest.mark.parametrize(
    "part", ["encode", "encode_history", "policy", "dynamics", "reward", "value"]
)
def test_nonfinite_model_output_raises(part):
    model = QuadraticToyModel([0.3, -0.2])
    model.nan_in.add(part)
    planner = make(model, num_samples=32, iterations=2, num_elites=4)
    with pytest.raises(PlannerError, match="non-finite"):
        planner.plan(*inputs())


def test_planner_recovers_after_a_nonfinite_step():
    model = QuadraticToyModel([0.3, -0.2])
    planner = make(model, num_samples=32, iterations=2, num_elites=4)
    planner.plan(*inputs())
    model.nan_in.add("reward")
    with pytest.raises(PlannerError):
        planner.plan(*inputs())
    model.nan_in.clear()
    result = planner.plan(*inputs())  # the NaN mean of the failed step is not warm-started
    assert np.all(np.isfinite(result.mean)) and result.nonfinite_candidates == 0


def test_nonfinite_observation_is_reported():
    planner = make(QuadraticToyModel([0.3, -0.2]), num_samples=32, iterations=2, num_elites=4)
    with pytest.raises(PlannerError, match="observation input"):
        planner.plan(*inputs(z0=(float("nan"), 0.0)))


def test_some_nonfinite_candidates_are_discarded_when_tolerated():
    model = QuadraticToyModel([0.3, -0.2])
    model.nan_reward_where = lambda actions: actions[..., 0] > 0.9  # rare, extreme candidates
    strict = make(model, num_samples=128, iterations=3, num_elites=16)
    with pytest.raises(PlannerError, match="candidate"):
        strict.plan(*inputs())
    tolerant = make(
        model, num_samples=128, iterations=3, num_elites=16, max_nonfinite_candidates=384
    )
    result = tolerant.plan(*inputs())
    assert result.nonfinite_candidates > 0 and np.all(np.isfinite(result.action))


def test_training_mode_model_is_refused():
    model = QuadraticToyModel([0.0, 0.0])
    model.training = True
    with pytest.raises(PlannerError, match="eval"):
        make(model).plan(*inputs())


def test_wrong_input_shapes_raise_clear_errors():
    planner = make(QuadraticToyModel([0.0, 0.0]))
    obs, proprio, actions = inputs()
    with pytest.raises(PlannerError, match="batch dimension 1"):
        planner.plan({"proprio": torch.zeros(2, A)}, proprio, actions)
    with pytest.raises(PlannerError, match="action dim"):
        planner.plan(obs, proprio, torch.zeros(1, H, A + 1))
    wrong_horizon = make(QuadraticToyModel([0.0, 0.0]), horizon=4)
    wrong_horizon.model.horizon = 5
    with pytest.raises(PlannerError, match="horizon"):
        wrong_horizon.plan(obs, proprio, actions)


def test_no_tensor_growth_across_steps():
    planner = make(QuadraticToyModel([0.3, -0.2]), num_samples=64, iterations=2, num_elites=8)
    for _ in range(3):
        planner.plan(*inputs())

    def live_tensors():
        gc.collect()
        return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))

    before = live_tensors()
    for _ in range(40):
        planner.plan(*inputs())
    assert live_tensors() == before


def test_config_defaults_and_validation():
    go2 = go2_planner_config([-5.0] * 12, [5.0] * 12)
    assert (go2.num_samples, go2.num_policy_samples, go2.num_candidates) == (450, 22, 472)
    assert (go2.iterations, go2.num_elites, go2.horizon) == (8, 64, 25)
    assert go2.temperature == GO2_TEMPERATURE == 30.0  # not mppi.yaml's 0.25: see its comment
    assert (go2.init_std, go2.min_std, go2.policy_noise_std, go2.discount, go2.delay) == (
        2.0,
        0.05,
        0.05,
        0.99,
        1,
    )
    ur5e = ur5e_planner_config([-1.0] * 7, [1.0] * 7, num_samples=100)
    assert (ur5e.horizon, ur5e.init_std, ur5e.policy_noise_std, ur5e.temperature) == (
        5,
        1.0,
        0.1,
        0.4,
    )
    assert ur5e.num_samples == 100
    assert (go2.warm_start, go2.value_discount_offset, go2.clamp_actions) == ("shift", 0, True)
    assert (ur5e.warm_start, ur5e.value_discount_offset, ur5e.clamp_actions) == ("shift", 0, True)
    # the official preset is mppi.yaml and MppiController as released
    official = official_planner_config([-5.0] * 12, [5.0] * 12)
    assert (official.num_samples, official.iterations, official.num_elites) == (450, 8, 64)
    assert (official.temperature, official.mixture_coef, official.policy_noise_std) == (
        0.25, 0.05, 0.05
    )  # fmt: skip
    assert (official.init_std, official.min_std, official.discount, official.delay) == (
        2.0, 0.05, 0.99, 1
    )  # fmt: skip
    assert (official.warm_start, official.value_discount_offset, official.clamp_actions) == (
        "roll", 1, False
    )  # fmt: skip
    assert (official.momentum, official.seed, official.horizon) == (0.0, 42, 25)
    with pytest.raises(ValueError, match="value_discount_offset"):
        PlannerConfig(horizon=5, action_low=(-1.0,), action_high=(1.0,), value_discount_offset=2)
    with pytest.raises(ValueError, match="num_elites"):
        PlannerConfig(
            horizon=5, action_low=(-1.0,), action_high=(1.0,), num_samples=10, num_elites=64
        )
    with pytest.raises(ValueError, match="delay"):
        PlannerConfig(horizon=5, action_low=(-1.0,), action_high=(1.0,), delay=0)
    with pytest.raises(ValueError, match="action_low < action_high"):
        PlannerConfig(horizon=5, action_low=(1.0,), action_high=(-1.0,))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_contract():
    model = QuadraticToyModel([0.3, -0.5])
    model.target = model.target.cuda()
    model.value_target = model.value_target.cuda()
    model.horizon = 5
    planner = MPPIPlanner(
        model,
        PlannerConfig(horizon=5, action_low=(-1.0,) * A, action_high=(1.0,) * A, mixture_coef=0.0),
        "cuda",
    )
    for _ in range(6):
        result = planner.plan(*inputs())
    np.testing.assert_allclose(result.action, [0.3, -0.5], atol=0.05)


def _real_inputs(cfg):
    g = torch.Generator().manual_seed(0)
    obs = {"proprio": torch.randn(1, cfg.proprio_dim, generator=g)}
    if cfg.height_map is not None:
        obs["height_map"] = torch.randn(1, *cfg.height_map.shape, generator=g)
    if cfg.command_dim:
        obs["command"] = torch.randn(1, cfg.command_dim, generator=g)
    if cfg.image is not None:
        obs["images"] = torch.randint(
            0, 256, (1, cfg.num_cameras, 3, 32, 32), dtype=torch.uint8, generator=g
        )
    return (
        obs,
        torch.randn(1, cfg.history, cfg.proprio_dim, generator=g),
        torch.randn(1, cfg.history, cfg.action_dim, generator=g),
    )


@pytest.mark.parametrize("robot", ["go2", "ur5e"])
def test_runs_on_real_world_model(robot):
    torch.manual_seed(0)
    if robot == "go2":
        cfg = go2_config(latent_dim=16, history=4, horizon=4)
        config = go2_planner_config(
            [-1.0] * 12, [1.0] * 12, horizon=4, num_samples=40, num_elites=8, iterations=2
        )
    else:
        image = ImageEncoderConfig(
            UR5E_CAMERAS,
            32,
            32,
            backbone="small_cnn",
            small_cnn_channels=(8, 8),
            small_cnn_features=16,
        )
        cfg = ur5e_small_config(
            latent_dim=16, image=image, policy_proprio_skip=True
        )  # pi reads o^p_t too
        config = ur5e_planner_config(
            [-0.5] * 6 + [0.0], [0.5] * 6 + [1.0], num_samples=40, num_elites=8, iterations=2
        )
    model = WorldModel(cfg).eval()
    planner = MPPIPlanner(model, config)
    first = [planner.plan(*_real_inputs(cfg)) for _ in range(2)]
    planner.reset()
    again = [planner.plan(*_real_inputs(cfg)) for _ in range(2)]
    for r in first:
        assert r.mean.shape == (cfg.horizon, cfg.action_dim) and r.rewards.shape == (cfg.horizon,)
        assert np.all(r.mean >= np.array(config.action_low)) and np.all(
            r.mean <= np.array(config.action_high)
        )
        assert np.all(np.isfinite(r.values)) and r.nonfinite_candidates == 0
    np.testing.assert_array_equal(first[1].mean, again[1].mean)  # reset reproduces the episode
    model.train()
    with pytest.raises(PlannerError, match="eval"):
        planner.plan(*_real_inputs(cfg))


class _Uncached:
    """A WorldModel whose planner-facing `dynamics_context` is a no-op: f recomputes its context."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def dynamics_context(self, z, history):
        return None


@pytest.mark.parametrize("kind", ["chunked", "autoregressive"])
def test_dynamics_context_is_built_once_per_step_and_keeps_the_plan(kind):
    torch.manual_seed(0)
    cfg = go2_config(latent_dim=16, history=4, horizon=4, dynamics_kind=kind)
    config = go2_planner_config(
        [-1.0] * 12, [1.0] * 12, horizon=4, num_samples=40, num_elites=8, iterations=3
    )
    model = WorldModel(cfg).eval()
    rows = count_kv_rows(model)
    cached = MPPIPlanner(model, config).plan(*_real_inputs(cfg))
    context_rows = cfg.dynamics.layers * (2 * cfg.history + 1)
    assert rows == {"k": context_rows, "v": context_rows}  # one batch-1 context for the whole step
    plain = MPPIPlanner(_Uncached(model), config).plan(*_real_inputs(cfg))
    scored = config.num_candidates + config.num_samples * (config.iterations - 1)
    assert rows["k"] > context_rows * scored  # what the cache saves
    np.testing.assert_allclose(cached.action, plain.action, atol=1e-5)
    np.testing.assert_allclose(cached.mean, plain.mean, atol=1e-5)
    np.testing.assert_allclose(cached.rewards, plain.rewards, atol=1e-4)
