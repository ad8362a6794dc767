"""ps.torch.RowWiseAdagrad: row-wise Adagrad as a plain torch optimizer, the
update the servers' tables run (table optimizer rowwise_adagrad, bit for bit).

Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD, DLRM's RWSAdagrad,
TorchRec's default for embeddings) keeps one state float per embedding row
instead of one per value.  For each row touched by a sparse gradient g
(dim values; rows repeated in the gradient summed first), in float32:

    g' = g + weight_decay * w                    (weight_decay 0: g' = g)
    m += (g'_0^2 + g'_1^2 + ... + g'_{dim-1}^2) / dim    (summed in that order)
    r  = lr / (sqrt(m) + eps)
    w  = (1 - r * weight_decay) * w - r * g      (weight_decay 0: w - r * g)

(FBGEMM's CPU kernel with weight_decay_mode 1; the servers' kernel is
common/ps_table_row.c's ps_table_rowwise_adagrad.)  A dense gradient (an MLP's
weights) gets Adagrad, as DLRM's RWSAdagrad does (computed as the servers'
adagrad rounds it): its state is Adagrad's `sum` and `step`, and ps.torch
maps it to the servers' adagrad.
Give embeddings sparse=True for the row-wise rule (a dense embedding
gradient is a dense gradient).

The state of a parameter with sparse gradients is `sum`, one float per row
(shape (rows,)), and `step`.
"""

import torch


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad (see the module's text): lr, eps and weight_decay as
    torch.optim.Adagrad's."""

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0):
        if not lr >= 0.0:
            raise ValueError("Invalid learning rate: {}".format(lr))
        if not eps >= 0.0:
            raise ValueError("Invalid epsilon value: {}".format(eps))
        if not weight_decay >= 0.0:
            raise ValueError("Invalid weight_decay value: {}".format(weight_decay))
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] = state.get("step", torch.tensor(0.0)) + 1
                if p.grad.is_sparse:
                    _rowwise(p, p.grad, state, lr, eps, wd)
                else:
                    _adagrad(p, p.grad, state, lr, eps, wd)
        return loss


def _rowwise(p, grad, state, lr, eps, wd):
    """The row-wise rule on the rows of a sparse gradient (coalesced: a row's
    repeats summed)."""
    if p.dim() != 2:
        raise ValueError("RowWiseAdagrad's row-wise rule is for 2-D embedding weights, got a "
                         "sparse gradient of shape %s" % (tuple(p.shape),))
    if "sum" not in state:
        state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)
    grad = grad.coalesce()
    rows, g = grad.indices()[0], grad.values()
    if rows.numel() == 0:
        return
    w = p[rows]
    gp = g + w * wd if wd else g
    dim = p.shape[1]
    sq = gp[:, 0] * gp[:, 0]
    for k in range(1, dim):  # in order, as the servers' kernel sums
        sq = sq + gp[:, k] * gp[:, k]
    m = state["sum"][rows] + sq / dim
    state["sum"][rows] = m
    r = torch.div(torch.tensor(lr, dtype=torch.float32, device=p.device), m.sqrt() + eps)
    r = r.unsqueeze(1)
    if wd:
        c = 1.0 - r * torch.tensor(wd, dtype=torch.float32, device=p.device)
        p[rows] = c * w - g * r
    else:
        p[rows] = w - g * r


def _adagrad(p, grad, state, lr, eps, wd):
    """Adagrad's dense update (lr_decay 0, initial accumulator 0): torch's
    single-tensor step, op for op (torch.optim.Adagrad), which the servers'
    adagrad computes bit for bit (server/optimizer.c)."""
    if "sum" not in state:
        state["sum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    if wd:
        grad = grad.add(p, alpha=wd)
    h = state["sum"]
    h.addcmul_(grad, grad, value=1)
    p.addcdiv_(grad, h.sqrt().add_(eps), value=-lr)
