"""The shared denoisers (shapes, conditioning contract, gradients) and the EMA callback (the average itself,
evaluation with the average, training weights in the checkpoint, `load_ema_weights`)."""
from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from callbacks.ema import EMAWeights, load_ema_weights
from lightning_modules.shared.denoisers import MLPDenoiser, UNet, from_model_range, sinusoidal_embedding, to_model_range
from lightning_modules.shared.errors import UserInputError


def test_sinusoidal_embedding_values():
    emb = sinusoidal_embedding(torch.tensor([0, 3]), 4)
    # frequencies 1 and 1e-2: [cos(t), cos(t/100), sin(t), sin(t/100)]
    t = torch.tensor(3.0)
    expected = torch.stack([torch.tensor([1.0, 1.0, 0.0, 0.0]),
                            torch.stack([t.cos(), (t / 100).cos(), t.sin(), (t / 100).sin()])])
    torch.testing.assert_close(emb, expected)


def test_pixel_range_round_trip():
    x = torch.rand(2, 1, 4, 4)
    assert to_model_range(x).min() >= -1 and to_model_range(x).max() <= 1
    torch.testing.assert_close(from_model_range(to_model_range(x)), x)
    assert from_model_range(torch.tensor([-3.0, 3.0])).tolist() == [0.0, 1.0]


def test_mlp_denoiser_shapes_and_condition_contract():
    net = MLPDenoiser(data_dim=5, hidden_dim=16, depth=2, cond_dim=3)
    out = net(torch.randn(4, 5), torch.randint(0, 1000, (4,)), torch.randn(4, 3))
    assert out.shape == (4, 5)
    with pytest.raises(ValueError, match="needs a condition"):
        net(torch.randn(4, 5), torch.zeros(4))
    with pytest.raises(ValueError, match="cond_dim=0"):
        MLPDenoiser(data_dim=5, hidden_dim=16)(torch.randn(4, 5), torch.zeros(4), torch.randn(4, 3))
    # a scalar timestep is broadcast over the batch
    assert MLPDenoiser(data_dim=5, hidden_dim=16)(torch.randn(4, 5), torch.tensor(10)).shape == (4, 5)


@pytest.mark.parametrize("side,mults", [(8, (1, 2)), (16, (1, 2, 2)), (28, (1, 2, 2))])
def test_unet_shapes_and_every_parameter_gets_a_gradient(side, mults):
    net = UNet(in_channels=2, out_channels=1, base_channels=8, channel_mults=mults, cond_dim=4, time_dim=16)
    x = torch.randn(3, 2, side, side)
    out = net(x, torch.randint(0, 1000, (3,)), torch.randn(3, 4))
    assert out.shape == (3, 1, side, side)
    out.square().mean().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_unet_rejects_bad_sizes():
    with pytest.raises(ValueError, match="divisible by 4"):
        UNet(1, 1, base_channels=8, channel_mults=(1, 2, 2))(torch.randn(1, 1, 10, 10), torch.zeros(1))
    with pytest.raises(UserInputError, match="channel_mults"):
        UNet(1, 1, channel_mults=())


class _Regression(pl.LightningModule):
    """y = 2x with a single weight; records the weight seen by every validation step."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(1, 1, bias=False)
        nn.init.zeros_(self.layer.weight)
        self.seen_in_validation: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return (self.layer(x) - y).square().mean()

    def validation_step(self, batch, batch_idx):
        self.seen_in_validation.append(self.layer.weight.item())

    def predict_step(self, batch, batch_idx):
        return self.layer.weight.detach().clone()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader():
    x = torch.ones(4, 1)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, 2 * x), batch_size=4)


def test_ema_average_evaluation_swap_and_checkpoint(tmp_path):
    torch.manual_seed(0)
    model, ema = _Regression(), EMAWeights(decay=0.5)
    trainer = pl.Trainer(max_steps=3, limit_val_batches=1, num_sanity_val_steps=0, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[ema],
                         default_root_dir=tmp_path, check_val_every_n_epoch=1)
    trainer.fit(model, train_dataloaders=_loader(), val_dataloaders=_loader())
    # SGD on (w - 2)^2 with lr 0.1: w_k = 2 - 2 * 0.8^k ; EMA (decay 0.5) starting from w_0 = 0
    weights = [2 - 2 * 0.8 ** k for k in range(4)]
    average = weights[0]
    for w in weights[1:]:
        average = 0.5 * average + 0.5 * w
    assert ema.updates == 3
    assert ema.averages["layer.weight"].item() == pytest.approx(average, abs=1e-6)
    assert model.seen_in_validation[-1] == pytest.approx(average, abs=1e-6)  # validation used the average
    assert model.layer.weight.item() == pytest.approx(weights[-1], abs=1e-6)  # training weights are back
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)
    assert saved["state_dict"]["layer.weight"].item() == pytest.approx(weights[-1], abs=1e-6)
    fresh = _Regression()
    assert load_ema_weights(fresh, str(path)) == 3
    assert fresh.layer.weight.item() == pytest.approx(average, abs=1e-6)
    predicted = trainer.predict(model, dataloaders=_loader())[0]
    assert predicted.item() == pytest.approx(average, abs=1e-6)
    assert model.layer.weight.item() == pytest.approx(weights[-1], abs=1e-6)


def test_load_ema_weights_needs_ema_state(tmp_path):
    path = tmp_path / "plain.ckpt"
    torch.save({"state_dict": _Regression().state_dict()}, path)
    with pytest.raises(UserInputError, match="EMAWeights"):
        load_ema_weights(_Regression(), str(path))
    with pytest.raises(UserInputError, match="decay"):
        EMAWeights(decay=1.5)
