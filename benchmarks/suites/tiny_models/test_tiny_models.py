"""A user's own test suite, in miniature: tiny models in plain PyTorch, a few training steps each
(MLPs, a conv net, attention, layer norms, a transformer layer, an LSTM, embeddings), 48 tests.
benchmarks/suite_overhead.py runs it plain and under each msprobe task; it knows nothing of msprobe."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn, steps: int = 5, lr: float = 1e-2,
           opt: str = "adam") -> list[float]:
    optim = (torch.optim.Adam if opt == "adam" else torch.optim.SGD)(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optim.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optim.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("width", [16, 32, 64])
@pytest.mark.parametrize("act", [nn.ReLU, nn.GELU])
@pytest.mark.parametrize("opt", ["adam", "sgd"])
def test_mlp_learns(width, act, opt):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, width), act(), nn.Linear(width, width), act(), nn.Linear(width, 3))
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    losses = _train(model, x, y, F.cross_entropy, steps=8, lr=0.05 if opt == "sgd" else 1e-2, opt=opt)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("channels", [4, 8])
@pytest.mark.parametrize("norm", ["batch", "group", "none"])
def test_conv_net_trains(channels, norm):
    torch.manual_seed(1)
    norm_layer = {"batch": nn.BatchNorm2d(channels), "group": nn.GroupNorm(2, channels), "none": nn.Identity()}[norm]
    model = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), norm_layer, nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(channels, 4))
    x, y = torch.randn(8, 1, 16, 16), torch.randint(0, 4, (8,))
    losses = _train(model, x, y, F.cross_entropy, steps=4)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert model(x).shape == (8, 4)


class TinyAttention(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_regression(heads, causal):
    torch.manual_seed(2)
    model = TinyAttention(16, heads, causal)
    x = torch.randn(4, 10, 16)
    target = x.flip(1)
    losses = _train(model, x, target, F.mse_loss, steps=5)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("heads", [2, 4])
def test_causal_attention_ignores_the_future(heads):
    torch.manual_seed(3)
    model = TinyAttention(16, heads, causal=True).eval()
    x = torch.randn(2, 8, 16)
    changed = x.clone()
    changed[:, -1] += 1.0
    with torch.no_grad():
        assert torch.allclose(model(x)[:, :-1], model(changed)[:, :-1], atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 16), (2, 5, 32), (3, 7, 64)])
def test_layer_norm_matches_the_formula(shape):
    torch.manual_seed(4)
    x = torch.randn(*shape) * 3 + 1
    ln = nn.LayerNorm(shape[-1])
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    assert torch.allclose(ln(x), (x - mean) / torch.sqrt(var + ln.eps), atol=1e-5)


@pytest.mark.parametrize("d", [8, 32, 128])
def test_layer_norm_gradients_are_finite(d):
    torch.manual_seed(5)
    x = torch.randn(6, d, requires_grad=True)
    ln = nn.LayerNorm(d)
    (ln(x) ** 2).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(ln.weight.grad).all()


@pytest.mark.parametrize("d_model", [16, 32])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_layer_trains(d_model, norm_first):
    torch.manual_seed(6)
    layer = nn.TransformerEncoderLayer(d_model, nhead=2, dim_feedforward=2 * d_model, dropout=0.0,
                                       batch_first=True, norm_first=norm_first)
    model = nn.Sequential(layer, nn.Linear(d_model, 5))
    x, y = torch.randn(4, 6, d_model), torch.randint(0, 5, (4, 6))
    losses = _train(model, x, y, lambda out, t: F.cross_entropy(out.reshape(-1, 5), t.reshape(-1)), steps=4)
    assert losses[-1] < losses[0]


class SeqModel(nn.Module):
    def __init__(self, cell: str, hidden: int) -> None:
        super().__init__()
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(4, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("hidden", [8, 16])
def test_recurrent_model_fits_a_sum(cell, hidden):
    torch.manual_seed(7)
    x = torch.randn(16, 5, 4)
    y = x.sum(dim=(1, 2)).unsqueeze(1)
    losses = _train(SeqModel(cell, hidden), x, y, F.mse_loss, steps=6)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("vocab", [20, 50])
@pytest.mark.parametrize("pool", ["mean", "max"])
def test_embedding_classifier(vocab, pool):
    torch.manual_seed(8)
    emb, head = nn.Embedding(vocab, 12), nn.Linear(12, 2)
    tokens, labels = torch.randint(0, vocab, (16, 7)), torch.randint(0, 2, (16,))

    def model(t: torch.Tensor) -> torch.Tensor:
        e = emb(t)
        return head(e.mean(1) if pool == "mean" else e.max(1).values)

    params = [*emb.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    first = None
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < first


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_rows_sum_to_one(dim):
    x = torch.randn(5, 6, 7) * 10
    assert torch.allclose(F.softmax(x, dim=dim).sum(dim), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_losses_agree_with_their_definitions(reduction):
    torch.manual_seed(9)
    logits, target = torch.randn(10, 4), torch.randint(0, 4, (10,))
    nll = -F.log_softmax(logits, -1).gather(1, target[:, None]).squeeze(1)
    expected = nll.mean() if reduction == "mean" else nll.sum()
    assert torch.allclose(F.cross_entropy(logits, target, reduction=reduction), expected, atol=1e-5)


def test_dropout_is_identity_in_eval():
    drop = nn.Dropout(0.5).eval()
    x = torch.randn(100)
    assert torch.equal(drop(x), x)


def test_weight_decay_shrinks_weights():
    torch.manual_seed(10)
    lin = nn.Linear(8, 8)
    before = lin.weight.detach().norm()
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2, weight_decay=0.5)
    for _ in range(3):
        opt.zero_grad()
        (lin(torch.zeros(1, 8)) * 0).sum().backward()
        opt.step()
    assert lin.weight.detach().norm() < before
