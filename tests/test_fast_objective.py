"""The planner's fast evaluator against the eager reference (planning.fast_objective).

Contract (docs/planner.md): in float32, on the same candidate set, the fast returns are within
1e-4 of the eager ones relative to the largest |return|, and the elite sets are the same; with the
same seed the executed action is within 1e-3. Chunked and autoregressive f, transformer and MLP
heads, with and without a command; on CUDA too when present. In bfloat16 (`precision`), the
returns are within 2e-2 of the largest |return| and at least 20 of 24 elites are the same.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from simdist_planner.model.config import OFFICIAL_NUMERICS, go2_config, ur5e_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning import fast_objective
from simdist_planner.planning import planner as planner_module
from simdist_planner.planning.config import PlannerConfig, official_planner_config
from simdist_planner.planning.fast_objective import FastObjective
from simdist_planner.planning.planner import MPPIPlanner, PlannerError

RETURN_RTOL = 1e-4
ACTION_ATOL = 1e-3
# bfloat16 keeps 8 bits of mantissa through f, R and V (the heads' outputs are float32); the
# test models' returns land within 0.4-0.6 % of the largest |return|, with 23-24 of 24 elites.
BF16_RETURN_RTOL = 2e-2
BF16_SAME_ELITES = 20  # of 24
ROOT = pathlib.Path(__file__).resolve().parents[1]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BF16_DEVICES = [d for d in DEVICES if planner_module.bf16_supported(torch.device(d))]


def small_model(
    kind="chunked", heads="transformer", command=True, seed=0, device="cpu", history=6, horizon=8
):
    """A random Go2-layout model (the official flags: z_t token into R, tanh GELU) at test size;
    command=False gives the UR5e's command-free heads on the same inputs."""
    torch.manual_seed(seed)
    cfg = go2_config(
        latent_dim=32,
        history=history,
        horizon=horizon,
        dynamics_kind=kind,
        head_kind=heads,
        reward_reads_latent_token=True,
        command_dim=3 if command else 0,
        numerics=OFFICIAL_NUMERICS,
    )
    return WorldModel(cfg).to(device).eval()


def inputs(cfg, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = {
        "proprio": torch.randn(1, cfg.proprio_dim, generator=g),
        "height_map": torch.randn(1, *cfg.height_map.shape, generator=g),
    }
    if cfg.command_dim:
        obs["command"] = torch.randn(1, cfg.command_dim, generator=g)
    history = (
        torch.randn(1, cfg.history, cfg.proprio_dim, generator=g),
        torch.randn(1, cfg.history, cfg.action_dim, generator=g),
    )
    return {k: v.to(device) for k, v in obs.items()}, *(t.to(device) for t in history)


def planner_config(cfg, evaluator, **overrides):
    a = cfg.action_dim
    settings = dict(num_samples=96, num_elites=12, iterations=3, horizon=cfg.horizon)
    settings.update(overrides)
    return official_planner_config([-1.0] * a, [1.0] * a, evaluator=evaluator, **settings)


def scores(model, evaluator, chunks, device, precision="float32"):
    config = planner_config(model.config, evaluator, precision=precision)
    planner = MPPIPlanner(model, config, device)
    assert planner.evaluator == evaluator
    return planner.score(*inputs(model.config, device), chunks)


CASES = [  # (f, heads, command, history, horizon)
    ("chunked", "transformer", True, 6, 8),
    ("autoregressive", "transformer", True, 6, 8),
    ("chunked", "mlp", True, 6, 8),
    ("chunked", "transformer", False, 6, 8),
    ("chunked", "transformer", True, 12, 20),  # attention rows >= SHORT_ROW: torch's softmax
]


def eager_and_fast(case, device, precision="float32"):
    """The eager and the fast returns of one CASES model on the same 200 random chunks."""
    kind, heads, command, history, horizon = case
    model = small_model(kind, heads, command, device=device, history=history, horizon=horizon)
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    chunks = (2.0 * torch.randn(200, cfg.horizon, cfg.action_dim, generator=g)).to(device)
    return scores(model, "eager", chunks, device), scores(model, "fast", chunks, device, precision)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_fast_returns_and_elites_match_eager_on_the_same_candidates(case, device):
    eager, fast = eager_and_fast(case, device)
    scale = float(eager.abs().max())
    assert scale > 0 and float(eager.std()) > 1e-3 * scale  # the candidates are told apart
    torch.testing.assert_close(fast, eager, rtol=RETURN_RTOL, atol=RETURN_RTOL * scale)
    elites = 24
    assert set(fast.topk(elites).indices.tolist()) == set(eager.topk(elites).indices.tolist())


@pytest.mark.parametrize("device", BF16_DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_bfloat16_returns_stay_within_their_bound_of_the_float32_reference(case, device):
    eager, bf16 = eager_and_fast(case, device, precision="bfloat16")
    assert bf16.dtype == torch.float32
    scale = float(eager.abs().max())
    assert 0 < float((bf16 - eager).abs().max()) <= BF16_RETURN_RTOL * scale  # bf16, within bound
    same = set(bf16.topk(24).indices.tolist()) & set(eager.topk(24).indices.tolist())
    assert len(same) >= BF16_SAME_ELITES


def test_bfloat16_attention_beyond_exps_range_is_recomputed_shifted():
    """`_attend` in bfloat16 takes exp(score) unshifted; a row past exp's range (scores of
    hundreds here) must give the softmax of the same scores, not inf / 0 / NaN, and a NaN
    input must stay NaN for the planner's check to see."""
    g = torch.Generator().manual_seed(0)
    q, k_t, v = (torch.randn(*shape, generator=g) for shape in ((6, 5, 8), (6, 8, 5), (6, 5, 8)))
    mask = torch.zeros(5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -torch.inf)
    for scale in (1.0, 80.0):  # the unshifted path, then the recomputation
        qb, kb, vb, mb = (t.bfloat16() for t in (q * scale, k_t, v, mask))
        scores = torch.baddbmm(mb, qb, kb).double()
        expected = torch.softmax(scores, -1) @ vb.double()
        got = fast_objective._attend(qb, kb, vb, mb)
        assert got.dtype == torch.bfloat16 and bool(torch.isfinite(got).all())
        torch.testing.assert_close(got.double(), expected, atol=2e-2, rtol=2e-2)
    assert float((q * 80.0 @ k_t).abs().max()) > 100  # exp overflows float32 / bfloat16 there
    q[0, 0, 0] = torch.nan
    got = fast_objective._attend(q.bfloat16(), k_t.bfloat16(), v.bfloat16(), None)
    assert bool(got[0, 0].isnan().all()) and bool(torch.isfinite(got[1:]).all())


def test_precision_is_checked_before_planning(monkeypatch):
    model = small_model()
    with pytest.raises(ValueError, match="precision must be one of"):
        planner_config(model.config, "fast", precision="float16")
    with pytest.raises(ValueError, match="needs evaluator 'fast'"):
        planner_config(model.config, "eager", precision="bfloat16")

    class Wrapped:  # a model the fast evaluator does not support
        def __getattr__(self, name):
            return getattr(model, name)

    config = planner_config(model.config, "fast", precision="bfloat16")
    with pytest.raises(ValueError, match="does not support a Wrapped"):
        MPPIPlanner(Wrapped(), config)
    monkeypatch.setattr(planner_module, "bf16_supported", lambda device: False)
    with pytest.raises(ValueError, match="cpu has no bf16 arithmetic"):
        MPPIPlanner(model, config)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["chunked", "autoregressive"])
def test_fast_planner_executes_the_eager_action_with_the_same_seed(kind, device):
    model = small_model(kind, device=device)
    plans = {}
    for evaluator in ("eager", "fast"):
        planner = MPPIPlanner(model, planner_config(model.config, evaluator), device)
        plans[evaluator] = [planner.plan(*inputs(model.config, device, seed=s)) for s in range(3)]
    for eager, fast in zip(plans["eager"], plans["fast"], strict=True):
        np.testing.assert_allclose(fast.action, eager.action, atol=ACTION_ATOL)
        np.testing.assert_allclose(fast.mean, eager.mean, atol=ACTION_ATOL)
        assert np.abs(eager.action).max() > 0.05  # a real plan, not the zero warm start


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_fast_path_reads_the_weights_at_every_step(precision):
    """The adapter fine-tunes f in place: the fast path reads (bfloat16: casts) the weights anew
    at every step."""
    if precision == "bfloat16" and "cpu" not in BF16_DEVICES:
        pytest.skip("this CPU has no bf16 arithmetic")
    model = small_model()
    chunks = torch.randn(64, model.config.horizon, model.config.action_dim)
    fast = MPPIPlanner(model, planner_config(model.config, "fast", precision=precision))
    before = fast.score(*inputs(model.config), chunks)
    model.load_state_dict(small_model(seed=1).state_dict())
    after = fast.score(*inputs(model.config), chunks)
    eager = scores(model, "eager", chunks, "cpu")
    assert not torch.allclose(before, after)
    tol = RETURN_RTOL if precision == "float32" else BF16_RETURN_RTOL
    torch.testing.assert_close(after, eager, rtol=0, atol=tol * float(eager.abs().max()))


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("part", ["dynamics", "reward", "value"])
def test_nonfinite_predictions_raise_on_the_fast_path(part, precision):
    if precision == "bfloat16" and "cpu" not in BF16_DEVICES:
        pytest.skip("this CPU has no bf16 arithmetic")
    model = small_model()
    module = {
        "dynamics": model.f.decoder.layers[-1].norm3,
        "reward": model.reward_head.out,
        "value": model.value_head.out,
    }[part]
    with torch.no_grad():
        module.bias[0] = float("nan")
    planner = MPPIPlanner(model, planner_config(model.config, "fast", precision=precision))
    with pytest.raises(PlannerError, match="non-finite"):
        planner.plan(*inputs(model.config))


def test_evaluator_choice_and_fallback_for_models_without_the_layout():
    model = small_model()
    assert FastObjective.supports(model)
    assert MPPIPlanner(model, planner_config(model.config, "fast")).evaluator == "fast"
    assert MPPIPlanner(model, planner_config(model.config, "eager")).evaluator == "eager"

    class Wrapped:  # any WorldModelLike that is not a WorldModel plans eagerly
        def __getattr__(self, name):
            return getattr(model, name)

    assert not FastObjective.supports(Wrapped())
    assert MPPIPlanner(Wrapped(), planner_config(model.config, "fast")).evaluator == "eager"
    with pytest.raises(TypeError, match="WorldModel"):
        FastObjective(Wrapped(), torch.ones(8), 1.0)
    with pytest.raises(ValueError, match="evaluator"):
        PlannerConfig(horizon=8, action_low=(-1.0,), action_high=(1.0,), evaluator="jit")


def test_official_size_ur5e_layout_matches_eager():
    """The UR5e's f (3 layers, 4 heads) and single-head R / V, no command: the image encoder is
    not on the fast path, so the test feeds z and history directly."""
    torch.manual_seed(0)
    model = WorldModel(ur5e_config(image=None, proprio_dim=6)).eval()
    cfg = model.config
    g = torch.Generator().manual_seed(2)
    z = torch.randn(1, cfg.latent_dim, generator=g)
    history = torch.randn(1, 2 * cfg.history, cfg.latent_dim, generator=g)
    chunks = torch.randn(128, cfg.horizon, cfg.action_dim, generator=g)
    planner = MPPIPlanner(model, planner_config(cfg, "eager"))
    with torch.no_grad():
        context = model.dynamics_context(z, history)
        eager = planner._scorer(z, history, context, None, 128)(chunks)[0]
        fast = FastObjective(model, planner._discounts, planner._tail_discount)
        got = fast.prepare(z, history, context, None)(chunks)[0]
    scale = float(eager.abs().max())
    torch.testing.assert_close(got, eager, rtol=RETURN_RTOL, atol=RETURN_RTOL * scale)


_FAULTS_PER_PLAN = """
import resource, sys, torch
from simdist_planner.model.config import go2_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning import cpu_memory, planner
from simdist_planner.planning.config import official_planner_config
sys.path.insert(0, "tests")
from test_fast_objective import inputs

def faults_per_plan(p, x):
    p.plan(*x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(2):
        p.plan(*x)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 2

torch.set_num_threads(2)
cpu_memory._applied = False  # as if already applied: the first planner leaves malloc as it is
model = WorldModel(go2_config()).eval()
config = official_planner_config([-1.0] * 12, [1.0] * 12, iterations=2)
x = inputs(model.config)
default = faults_per_plan(planner.MPPIPlanner(model, config), x)
cpu_memory._applied = None
tuned = faults_per_plan(planner.MPPIPlanner(model, config), x)
print(default, tuned, cpu_memory._applied)
"""


@pytest.mark.slow  # a memory-behaviour run of many plans
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning")
def test_cpu_planning_reuses_freed_memory_instead_of_faulting_in_new_pages():
    """An official-size Go2 plan in a fresh process: with glibc's defaults each step faults in
    tens of thousands of fresh pages; the planner's malloc settings (cpu_memory) reuse them."""
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS_PER_PLAN],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split()
    default, tuned, applied = float(out[0]), float(out[1]), out[2]
    assert applied == "True"
    assert default > 10_000  # what the settings are for
    assert tuned < 0.1 * default
