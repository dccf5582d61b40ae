"""FedPara layers: the paper's parameter count and rank rule, reconstruction equals the dense layer."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.api.client import ClientModule
from fl_lightning.errors import ConfigError
from fl_lightning.lightning.module import FederatedModule
from fl_lightning.models import FedPara, LeNet, SmallCNN
from fl_lightning.models.fedpara import (
    HadamardConv2d,
    HadamardLinear,
    fedpara_num_params,
    fedpara_rank,
)

from conftest import make_data


def _numel(module):
    return sum(p.numel() for n, p in module.named_parameters() if n != "bias")


def test_rank_and_parameter_count_follow_the_paper_by_hand():
    # conv 64->64, 5x5, gamma 0.1: r_min = 8, r_max = floor((-128 + sqrt(128^2 + 2*25*102400)) / 50) = 42,
    # R = ceil(0.9*8 + 0.1*42) = 12; 2 (R^2 k^2 + R (O + I)) = 2 (3600 + 1536) = 10272 (dense: 102400)
    assert fedpara_rank(64, 64, (5, 5), 0.1) == 12
    conv = HadamardConv2d(nn.Conv2d(64, 64, 5), 12)
    assert _numel(conv) == fedpara_num_params(64, 64, (5, 5), 12) == 10272
    # linear 1600->120: r_min = min(40, 11) = 11, r_max = 192000 // (2*1720) = 55, R = ceil(9.9 + 5.5) = 16;
    # 2 R (O + I) = 55040 (dense: 192000)
    assert fedpara_rank(120, 1600, None, 0.1) == 16
    lin = HadamardLinear(1600, 120, 16)
    assert _numel(lin) == fedpara_num_params(120, 1600, None, 16) == 55040


@pytest.mark.parametrize("shape", [(64, 64, (5, 5)), (128, 64, (3, 3)), (120, 1600, None), (10, 64, None)])
def test_r_max_is_the_largest_rank_within_the_dense_size(shape):
    out_f, in_f, kernel = shape
    dense = out_f * in_f * (1 if kernel is None else kernel[0] * kernel[1])
    r_max = fedpara_rank(out_f, in_f, kernel, 1.0)
    assert (
        fedpara_num_params(out_f, in_f, kernel, r_max)
        <= dense
        < fedpara_num_params(out_f, in_f, kernel, r_max + 1)
    )


def test_gamma_zero_reaches_full_rank_with_few_parameters():
    # Prop. 1: rank(W1 ⊙ W2) <= R^2, so full rank needs R^2 >= min(O, I): r_min = ceil(sqrt(min(O, I))).
    # O = 20, I = 30: sqrt(20) = 4.47, r_min = 5 (R = 4 could reach rank 16 only)
    torch.manual_seed(0)
    rank = fedpara_rank(20, 30, None, 0.0)
    assert rank == 5
    lin = HadamardLinear(30, 20, rank)
    assert torch.linalg.matrix_rank(lin.weight().detach()) == 20
    assert torch.linalg.matrix_rank((lin.x1 @ lin.y1.T).detach()) == 5  # one low-rank factor alone: rank R
    below = HadamardLinear(30, 20, rank - 1)
    assert torch.linalg.matrix_rank(below.weight().detach()) == 16  # R^2 < min(O, I): not full rank
    assert _numel(lin) == 2 * 5 * (20 + 30) == 500 < 20 * 30


def test_layers_equal_the_dense_layers_they_reconstruct():
    torch.manual_seed(0)
    conv = HadamardConv2d(nn.Conv2d(3, 6, 3, stride=2, padding=1), rank=2)
    with torch.no_grad():
        conv.bias.normal_()
    w1 = torch.stack([conv.x1 @ conv.t1[:, :, h, w] @ conv.y1.T for h in range(3) for w in range(3)], -1)
    w2 = torch.stack([conv.x2 @ conv.t2[:, :, h, w] @ conv.y2.T for h in range(3) for w in range(3)], -1)
    weight = (w1 * w2).reshape(6, 3, 3, 3)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(conv(x), F.conv2d(x, weight, conv.bias, stride=2, padding=1))
    lin = HadamardLinear(5, 4, rank=2)
    dense = nn.Linear(5, 4)
    with torch.no_grad():
        dense.weight.copy_((lin.x1 @ lin.y1.T) * (lin.x2 @ lin.y2.T))
        dense.bias.copy_(lin.bias)
    x = torch.randn(3, 5)
    torch.testing.assert_close(lin(x), dense(x))


def test_init_matches_the_dense_weight_scale():
    torch.manual_seed(0)
    conv = HadamardConv2d(nn.Conv2d(64, 64, 5), rank=12)
    dense_std = (1 / (3 * 64 * 25)) ** 0.5
    assert conv.weight().std().item() == pytest.approx(dense_std, rel=0.2)


def test_the_wrapper_replaces_every_layer_and_trains(fit):
    net = FedPara(LeNet(in_channels=1, widths=(4, 8), hidden=(16, 16), input_size=8, padding=2), gamma=0.5)
    kinds = [type(m) for m in net.modules()]
    assert kinds.count(HadamardConv2d) == 2 and kinds.count(HadamardLinear) == 3
    assert not any(k in (nn.Conv2d, nn.Linear) for k in kinds)
    convs_only = FedPara(SmallCNN(width=4, hidden=16), linear=False)
    assert sum(isinstance(m, nn.Linear) for m in convs_only.modules()) == 2
    # ranks at gamma 0.5 by hand, R = ceil((r_min + r_max) / 2); parameters with the biases:
    # conv 1->4 5x5: r_min 1, r_max 1, R 1: 2 (25 + 5) + 4 = 64; conv 4->8 5x5: r_min 2, r_max 3, R 3:
    # 2 (9 * 25 + 3 * 12) + 8 = 530; fc 32->16: R ceil((4 + 5) / 2) = 5: 2 * 5 * 48 + 16 = 496;
    # fc 16->16: R 4: 272; fc 16->10: r_min 4, r_max max(3, r_min) = 4, R 4: 218 (dense LeNet: 1882)
    layers = [m for m in net.modules() if isinstance(m, (HadamardConv2d, HadamardLinear))]
    assert [m.rank for m in layers] == [1, 3, 5, 4, 4]
    assert sum(p.numel() for p in net.parameters()) == 64 + 530 + 496 + 272 + 218 == 1580
    torch.manual_seed(0)
    module = FederatedModule(client=ClientModule(net, lr=0.5, momentum=0.0), local_steps=2)
    start = {n: p.detach().clone() for n, p in module.client.named_parameters()}
    fit(module, rounds=1, data=make_data())
    (record,) = module.history
    assert (record.clients, record.failed) == (4, 0)
    assert record.bytes_up == 4 * 1580 * 4  # every client uploads the factors (float32), not dense weights
    # every factor got a gradient and was aggregated: it moved by >= 1e-4 here, where the weighted mean
    # of identical values alone moves a tensor by float32 round-off (~1e-7)
    for n, p in module.client.named_parameters():
        assert float((p.detach() - start[n]).abs().max()) > 1e-5, n


def test_bad_gamma_names_the_field():
    with pytest.raises(ConfigError, match="model.client.init_args.net.init_args.gamma"):
        FedPara(SmallCNN(), gamma=1.5)
