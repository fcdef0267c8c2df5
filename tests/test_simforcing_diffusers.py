"""The Wan2.2 backbone through diffusers, built from tiny random configs (2 layers, 2 heads)."""

import pytest
import torch

from sim_video_world_model.backbones import build_backbone
from sim_video_world_model.config import BackboneConfig, ObjectiveConfig, Variant, WanBackboneConfig
from sim_video_world_model.objective import StudentObjective
from sim_video_world_model.pipeline import SimForcingPipeline
from sim_video_world_model.scheduler import FlowMatchScheduler
from sim_video_world_model.train import make_student

TRANSFORMER = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=16,
    ffn_dim=32,
    num_layers=2,
    cross_attn_norm=True,
    rope_max_seq_len=32,
)
VAE = dict(
    base_dim=3,
    z_dim=4,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
    latents_mean=[0.0] * 4,
    latents_std=[1.0] * 4,
)


def wan(seed=0):
    torch.manual_seed(seed)
    cfg = BackboneConfig(
        kind="wan",
        action_dim=7,
        wan=WanBackboneConfig(
            transformer_config=TRANSFORMER,
            vae_config=VAE,
            action_hidden=16,
            action_layers=1,
            action_heads=2,
        ),
    )
    ae, den = build_backbone(cfg)
    return ae, den.eval()


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 4, 2, 4, 4, generator=g),
        torch.tensor([250.0, 900.0]),
        torch.rand(2, 4, 7, generator=g) * 2 - 1,
        torch.randn(2, 4, 2, 4, 4, generator=g),
    )


def randomise(student):
    with torch.no_grad():
        for conv in student.sim_conditioning.projections:
            conv.weight.normal_(0, 0.5)
            conv.bias.normal_(0, 0.5)


def test_hook_adds_projection_exactly_after_cross_attention():
    _, teacher = wan()
    student = make_student(teacher, Variant.FULL)
    randomise(student)
    x, t, a, s = inputs()
    block = student.transformer.blocks[0]
    seen = {}
    block.attn2.register_forward_hook(
        lambda m, i, o: seen.__setitem__("raw", o.clone()), prepend=True
    )
    block.attn2.register_forward_hook(lambda m, i, o: seen.__setitem__("out", o.clone()))
    block.norm3.register_forward_pre_hook(lambda m, i: seen.__setitem__("ffn_in", i[0].clone()))
    block.attn1.register_forward_hook(lambda m, i, o: seen.__setitem__("self", o.clone()))
    gate = torch.ones(2)
    with torch.no_grad():
        student(x, t, a, sim_latent=s, gate=gate)
        on = dict(seen)
        student(x, t, a, sim_latent=s, gate=torch.zeros(2))
        off = dict(seen)
        tokens = student.sim_conditioning.tokens(0, s, gate)
    assert tokens.abs().max() > 0
    assert torch.allclose(on["out"] - on["raw"], tokens, atol=1e-6)  # added to attn2's output ...
    assert torch.equal(on["self"], off["self"])  # ... not before self-attention ...
    assert torch.allclose(
        on["ffn_in"] - off["ffn_in"], tokens, atol=1e-5
    )  # ... and it reaches the FFN input


def test_zero_init_and_gate_zero_on_wan():
    _, teacher = wan()
    student = make_student(teacher, Variant.FULL)
    x, t, a, s = inputs()
    with torch.no_grad():
        ref = teacher(x, t, a)
        assert torch.equal(student(x, t, a, sim_latent=s, gate=torch.ones(2)), ref)
        randomise(student)
        assert torch.equal(student(x, t, a, sim_latent=s, gate=torch.zeros(2)), ref)
        assert not torch.allclose(student(x, t, a, sim_latent=s, gate=torch.ones(2)), ref)
    assert ref.shape == x.shape


def test_wan_student_step_and_guided_inference():
    ae, teacher = wan()
    teacher.requires_grad_(False)
    student = make_student(teacher, Variant.FULL)
    student.set_gradient_checkpointing(True)  # the hook must survive recomputation in backward
    video = torch.rand(2, 3, 5, 32, 32) * 2 - 1
    with torch.no_grad():
        z = ae.encode(video)
    assert z.shape == (2, 4, 2, 4, 4) and ae.decode(z).shape == video.shape
    loss, m = StudentObjective(ObjectiveConfig(variant=Variant.FULL))(
        student.train(), teacher, z, z + 0.1, torch.rand(2, 4, 7), torch.Generator().manual_seed(0)
    )
    loss.backward()
    assert student.sim_conditioning.projections[1].weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    out = SimForcingPipeline(ae, student, FlowMatchScheduler())(
        video[:1, :, 0],
        torch.rand(1, 4, 7),
        5,
        robot_mask=torch.ones(1, 32, 32, dtype=torch.bool),
        sim_steps=1,
        real_steps=2,
        guidance=0.6,
    )
    assert out.video.shape == (1, 3, 5, 32, 32) and torch.isfinite(out.video).all()


def test_missing_local_weights_give_a_clear_error(tmp_path):
    cfg = BackboneConfig(
        kind="wan", wan=WanBackboneConfig(model_dir=str(tmp_path / "Wan2.2-TI2V-5B"))
    )
    with pytest.raises(FileNotFoundError, match="transformer/config.json"):
        build_backbone(cfg)
